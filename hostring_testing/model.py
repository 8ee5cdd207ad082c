"""The model a generated web is built from (WebModel), how it is rendered into Sites, and random models.

A model names every page by identity, ``(origin label, path)``, with its links, redirects, mirrors, robots and
traps. ``render_model`` turns it into ``Site`` objects whose HTML writes each link in one of many spellings a
correct crawler resolves back to the same page (relative, dot segments, percent-encoding, upper-case scheme,
explicit default port, scheme-relative, tracking parameters, fragments, ``<base href>``). The oracle
(``hostring_testing.oracle``) walks the model itself, never the rendered HTML.
"""

from __future__ import annotations

import html
import random
import zlib
from dataclasses import dataclass, field
from typing import Literal

from hostring_testing.identity import PCT_RE, UNRESERVED
from hostring_testing.pages import TEXT, Key, Page, Site, paragraph, redirect_page, robots_page, under_trap
from hostring_testing.robots import robots_allowed

__all__ = ["LinkSpec", "PageSpec", "RobotsSpec", "WebModel", "mirror_across", "random_model", "render_model"]


@dataclass
class LinkSpec:
    """A link to `target`; `href` fixes its spelling (placeholders allowed), else the renderer picks one."""

    target: Key
    nofollow: bool = False
    href: str | None = None


@dataclass
class PageSpec:
    """A page of the model: content page, redirect, or mirror (identical body) of another page."""

    links: list[LinkSpec] = field(default_factory=list)
    redirect_to: Key | None = None
    redirect_status: int = 301
    meta_nofollow: bool = False
    mirror_of: Key | None = None
    base: str | None = None
    """Directory path written as <base href> (same origin); relative links then resolve against it."""
    title: str = ""
    status: int = 200


@dataclass
class RobotsSpec:
    """An origin's robots: `file` (text), `missing` (404), `unavailable` (503), or `redirect` to a file
    elsewhere whose text applies to this origin (RFC 9309)."""

    kind: Literal["file", "missing", "unavailable", "redirect"] = "missing"
    text: str = ""
    redirect_to: Key | None = None


@dataclass
class WebModel:
    """A whole web by identity: what the oracle walks and the renderer turns into Sites."""

    origins: list[str]
    pages: dict[Key, PageSpec]
    robots: dict[str, RobotsSpec] = field(default_factory=dict)
    seeds: list[Key] = field(default_factory=list)
    traps: dict[str, str] = field(default_factory=dict)
    user_agent: str = "hostring"

    def in_trap(self, key: Key) -> bool:
        """Whether `key` lies under its origin's trap prefix."""
        return under_trap(self.traps.get(key[0]), key[1])

    def allowed(self, key: Key) -> bool:
        """Whether robots let the model's user agent fetch `key`."""
        spec = self.robots.get(key[0], RobotsSpec())
        if spec.kind == "missing":
            return True
        if spec.kind == "unavailable":
            return False
        return robots_allowed(spec.text, self.user_agent, key[1])


# ----------------------------------------------------------------------------------------------------
# Rendering a model into Sites


def _split(path: str) -> tuple[list[str], str, str]:
    """(directory segments, last segment, query) of an absolute path."""
    p, _, q = path.partition("?")
    segs = p.split("/")[1:]
    return segs[:-1], segs[-1], q


def _dir_of(path: str) -> str:
    p = path.partition("?")[0]
    return p[: p.rfind("/") + 1]


def _pct_variant(rng: random.Random, segment: str) -> str:
    """The segment with one unreserved character percent-encoded, or its escapes in lower-case hex."""
    if "%" in segment and rng.random() < 0.5:
        return PCT_RE.sub(lambda m: "%" + m.group(1).lower(), segment)
    spots = [i for i, ch in enumerate(segment) if ch in UNRESERVED and not _inside_escape(segment, i)]
    if not spots:
        return segment
    i = next((j for j in spots if segment[j] in "~-_"), None) if rng.random() < 0.6 else None
    i = rng.choice(spots) if i is None else i
    esc = f"%{ord(segment[i]):02X}"
    return segment[:i] + (esc.lower() if rng.random() < 0.3 else esc) + segment[i + 1 :]


def _inside_escape(s: str, i: int) -> bool:
    return (i >= 1 and s[i - 1] == "%") or (i >= 2 and s[i - 2] == "%")


def _spell(rng: random.Random, src: Key, base_dir: str, target: Key, *, relative_ok: bool) -> str:
    """One spelling of a link from page `src` to `target` that a correct crawler resolves back to `target`."""
    label, tpath = target
    same = label == src[0]
    forms = ["absolute", "absolute", "upper", "port", "netpath"]
    if same:
        forms += ["rootrel", "rootrel", "dotseg"]
        if relative_ok:
            forms += ["relative", "relative", "relative", "dot", "dotdot"]
    form = rng.choice(forms)
    tdirs, tfile, query = _split(tpath)
    pct = rng.random() < 0.2

    def emit(segs: list[str]) -> str:
        segs = list(segs)
        if pct:
            candidates = [i for i, s in enumerate(segs) if s]
            if candidates:
                i = rng.choice(candidates)
                segs[i] = _pct_variant(rng, segs[i])
        return "/".join(segs)

    if form in ("relative", "dot", "dotdot"):
        bsegs = base_dir.split("/")[1:-1]
        common = 0
        while common < min(len(bsegs), len(tdirs)) and bsegs[common] == tdirs[common]:
            common += 1
        up = len(bsegs) - common
        rest = emit([*tdirs[common:], tfile])
        if form == "dotdot":
            # Up one level and back down (at the root, RFC 3986 drops the excess "..").
            href = "../" + (bsegs[-1] + "/" if bsegs else "") + "../" * up + rest
        else:
            href = "../" * up + rest
            if not href or ":" in href.split("/", 1)[0] or (form == "dot" and not href.startswith(".")):
                href = "./" + href
    else:
        segs = ["", *tdirs, tfile]
        path = emit(segs)
        if form == "dotseg" and len(segs) > 2:
            i = rng.randint(1, len(segs) - 2)
            path = "/".join(segs[: i + 1]) + rng.choice(["/./", "/zz/../"]) + "/".join(segs[i + 1 :])
        host = {
            "absolute": f"{{{{origin:{label}}}}}",
            "upper": f"{{{{origin:{label}|upper}}}}",
            "port": f"{{{{origin:{label}|port}}}}",
            "netpath": f"//{{{{host:{label}}}}}",
        }.get(form, "")
        href = host + path
    if rng.random() < 0.15:
        tracking = rng.choice(["utm_source=news", "utm_source=rss&utm_medium=feed", "utm_campaign=spring"])
        parts = [tracking, query] if rng.random() < 0.5 else [query, tracking]
        query = "&".join(part for part in parts if part)
    if query:
        href += "?" + query
    if rng.random() < 0.15:
        href += "#" + rng.choice(["top", "sec-2", "comments", "Details"])
    return href


def render_model(model: WebModel, seed: int = 0) -> dict[str, Site]:
    """Sites serving `model`: HTML pages with varied link spellings, robots files, redirects, traps."""
    rng = random.Random(seed)
    sites: dict[str, Site] = {label: Site(trap=model.traps.get(label)) for label in model.origins}
    mirrored = {spec.mirror_of for spec in model.pages.values() if spec.mirror_of is not None}
    ordered = sorted(model.pages.items(), key=lambda kv: kv[1].mirror_of is not None)
    for key, spec in ordered:
        label, path = key
        if spec.redirect_to is not None:
            t_label, t_path = spec.redirect_to
            loc = t_path if t_label == label and rng.random() < 0.4 else f"{{{{origin:{t_label}}}}}{t_path}"
            sites[label].pages[path] = redirect_page(loc, spec.redirect_status)
        elif spec.mirror_of is not None:
            original = sites[spec.mirror_of[0]].pages[spec.mirror_of[1]]
            sites[label].pages[path] = Page(status=spec.status, body=original.body)
        else:
            sites[label].pages[path] = Page(
                status=spec.status, body=_render_html(rng, model, key, spec, relative_ok=key not in mirrored)
            )
    for label, robots in model.robots.items():
        if robots.kind == "file":
            sites[label].robots = robots_page(robots.text)
        elif robots.kind == "unavailable":
            sites[label].robots = Page(status=503, body=b"busy\n", content_type=TEXT, headers={"Retry-After": "60"})
        elif robots.kind == "redirect" and robots.redirect_to is not None:
            t_label, t_path = robots.redirect_to
            sites[label].robots = redirect_page(f"{{{{origin:{t_label}}}}}{t_path}")
            sites[t_label].pages[t_path] = robots_page(robots.text)
    return sites


def _render_html(rng: random.Random, model: WebModel, key: Key, spec: PageSpec, *, relative_ok: bool) -> bytes:
    label, path = key
    title = spec.title or f"{label} {path}"
    head = [f"<title>{html.escape(title)}</title>"]
    if spec.meta_nofollow:
        content = rng.choice(["nofollow", "noindex, nofollow", "NOFOLLOW", "noarchive,nofollow"])
        head.append(f'<meta name="{rng.choice(["robots", "ROBOTS"])}" content="{content}">')
    base_dir = _dir_of(path)
    if spec.base is not None:
        base_dir = spec.base
        href = spec.base if rng.random() < 0.5 else f"{{{{origin:{label}}}}}{spec.base}"
        head.append(f'<base href="{html.escape(href)}">')
    items = []
    for link in spec.links:
        href = link.href if link.href is not None else _spell(rng, key, base_dir, link.target, relative_ok=relative_ok)
        rel = ""
        if link.nofollow:
            rel = f' rel="{rng.choice(["nofollow", "ugc nofollow", "NoFollow", "nofollow noopener"])}"'
        anchor = model.pages[link.target].title if link.target in model.pages else ""
        anchor = anchor or link.target[1].strip("/").replace("/", " ") or "home"
        items.append(f'<li><a href="{html.escape(href)}"{rel}>{html.escape(anchor)}</a></li>')
    text_rng = random.Random(zlib.crc32(f"{label}|{path}".encode()))
    doc = "\n".join(
        [
            "<!DOCTYPE html>",
            '<html lang="en">',
            '<head>\n<meta charset="utf-8">',
            *head,
            "</head>",
            "<body>",
            f"<h1>{html.escape(title)}</h1>",
            f"<p>{paragraph(text_rng, 60)}</p>",
            '<ul class="links">',
            *items,
            "</ul>",
            f"<p>{paragraph(text_rng, 60)}</p>",
            "</body>",
            "</html>",
            "",
        ]
    )
    return doc.encode("utf-8")


# ----------------------------------------------------------------------------------------------------
# Random models


_SECTIONS = (
    "docs",
    "blog",
    "news",
    "shop",
    "about",
    "~alice",
    "help",
    "archive",
    "tags",
    "wiki",
    "team",
    "private",
    "events-old",
    "lists",
)
_SLUGS = (
    "intro",
    "setup",
    "getting-started",
    "faq",
    "release_notes",
    "road-map",
    "spring",
    "sprint",
    "print",
    "printable",
    "history",
    "contact",
    "pricing",
    "winter-sale",
    "tide_tables",
    "c%2B%2B",
    "a%20b",
    "drafts",
    "notes",
    "v1.2",
    "old.page",
    "hello-world",
    "team_photo",
    "index.html",
)


def _random_paths(rng: random.Random, n: int) -> list[str]:
    """n distinct normal-form paths, "/" first: sections, nested pages, query pages, trailing-slash twins."""
    sections = rng.sample(_SECTIONS, k=min(len(_SECTIONS), rng.randint(3, 5)))
    paths = ["/"]
    seen = {"/"}
    attempts = 0
    while len(paths) < n and attempts < n * 50:
        attempts += 1
        sec, slug = rng.choice(sections), rng.choice(_SLUGS)
        r = rng.random()
        if r < 0.15:
            cand = f"/{sec}/"
        elif r < 0.2:
            cand = f"/{sec}"
        elif r < 0.55:
            cand = f"/{sec}/{slug}"
        elif r < 0.75:
            cand = f"/{sec}/{rng.choice(_SLUGS)}/{slug}"
        elif r < 0.85:
            cand = f"/{sec}?{rng.choice(['page', 'sort', 'q'])}={rng.choice(['1', '2', 'asc', 'x-y'])}"
        else:
            cand = f"/{slug}"
        if cand not in seen and "/." not in cand:
            seen.add(cand)
            paths.append(cand)
    while len(paths) < n:
        paths.append(f"/extra/page-{len(paths)}")
    return paths


def _robots_text(rng: random.Random, paths: list[str], user_agent: str) -> str:
    """A robots file for these paths with the subtleties: longest match, Allow overrides and ties, wildcards,
    `$`, prefixes cutting a segment, percent-encoding, and a group for another bot that must not apply."""
    rules: list[tuple[str, str]] = []
    dirs: dict[str, list[str]] = {}
    for p in paths:
        if p.count("/") >= 2:
            dirs.setdefault("/" + p.split("/")[1] + "/", []).append(p)
    crowded = sorted(d for d, ps in dirs.items() if len(ps) >= 2)
    if crowded:
        section = rng.choice(crowded)
        spelled = section.replace("~", "%7E") if rng.random() < 0.5 else section
        rules.append(("Disallow", spelled))
        inner = sorted(p for p in dirs[section] if p != section and not _index_file(p))
        if inner:
            rules.append(("Allow", rng.choice(inner)))
    leaves = sorted(p for p in paths if "?" not in p and "%" not in p and len(p.rsplit("/", 1)[-1]) > 3)
    if leaves:
        leaf = rng.choice(leaves)
        rules.append(("Disallow", leaf[: len(leaf) - rng.randint(1, 2)]))
    if any("sort=" in p for p in paths):
        rules.append(("Disallow", "/*?sort="))
    if any(p.endswith("/print") for p in paths):
        rules.append(("Disallow", "/*/print$"))
    plain_leaves = [p for p in leaves if not _index_file(p)]
    if plain_leaves and rng.random() < 0.5:
        tie = rng.choice(plain_leaves)
        rules += [("Disallow", tie), ("Allow", tie)]
    rng.shuffle(rules)
    body = "\n".join(f"{k}: {v}" for k, v in rules)
    other = "User-agent: otherbot\nCrawl-delay: 10\nDisallow: /\n"
    if rng.random() < 0.5:
        token = "".join(c.upper() if rng.random() < 0.3 else c for c in user_agent)
        return f"# robots.txt\nUser-agent: *\nDisallow: /\n\n{other}\nUser-agent: {token}\n{body}\n"
    return f"# robots.txt\n{other}\nUser-agent: *\n{body}\n"


def _index_file(path: str) -> bool:
    """Google's matcher (and protego) let `Allow: /d/index.html` also allow `/d/`; RFC 9309 does not, so
    generated Allow rules never name an index file and both readings agree."""
    return path.partition("?")[0].endswith(("/index.html", "/index.htm"))


def random_model(
    seed: int,
    *,
    origins: int = 6,
    pages_per_origin: int = 20,
    links_per_page: int = 8,
    robots_fraction: float = 0.5,
    unavailable_robots: int | None = None,
    redirect_robots_fraction: float = 0.3,
    cross_fraction: float = 0.2,
    nofollow_fraction: float = 0.08,
    meta_nofollow_fraction: float = 0.05,
    redirect_fraction: float = 0.05,
    mirror_fraction: float = 0.05,
    broken_fraction: float = 0.03,
    base_fraction: float = 0.1,
    trap_fraction: float = 0.2,
    seeds: int = 1,
    user_agent: str = "hostring",
) -> WebModel:
    """A deterministic random web model; `unavailable_robots` defaults to 1 origin (robots 503) if >= 3."""
    rng = random.Random(seed)
    labels = [f"site{i}" for i in range(origins)]
    paths = {label: _random_paths(rng, pages_per_origin) for label in labels}
    pages: dict[Key, PageSpec] = {(lb, p): PageSpec() for lb in labels for p in paths[lb]}
    traps = {lb: "/calendar" for lb in labels if rng.random() < trap_fraction}

    for label in labels:
        for i, path in enumerate(paths[label]):
            if i == 0:
                continue
            spec = pages[(label, path)]
            r = rng.random()
            if r < redirect_fraction:
                t_label = rng.choice(labels) if rng.random() < 0.5 else label
                spec.redirect_to = (t_label, rng.choice(paths[t_label]))
                spec.redirect_status = rng.choice([301, 302, 307, 308])
            elif r < redirect_fraction + mirror_fraction:
                cands = [
                    p
                    for p in paths[label][:i]
                    if pages[(label, p)].redirect_to is None and pages[(label, p)].mirror_of is None
                ]
                if cands:
                    spec.mirror_of = (label, rng.choice(cands))
            elif r < redirect_fraction + mirror_fraction + meta_nofollow_fraction:
                spec.meta_nofollow = True

    def content(key: Key) -> bool:
        return pages[key].redirect_to is None and pages[key].mirror_of is None

    for label in labels:
        # A spanning tree first, so most pages are reachable unless robots or nofollow say otherwise.
        for j, path in enumerate(paths[label][1:], start=1):
            parent = rng.choice([p for p in paths[label][:j] if content((label, p))])
            pages[(label, parent)].links.append(LinkSpec((label, path)))
        for path in paths[label]:
            key = (label, path)
            if not content(key):
                continue
            links = pages[key].links
            while len(links) < links_per_page:
                r = rng.random()
                if r < broken_fraction:
                    target = (label, f"/{rng.choice(_SECTIONS)}/missing-{rng.randint(1, 999)}")
                elif r < broken_fraction + cross_fraction and len(labels) > 1:
                    other = rng.choice([lb for lb in labels if lb != label])
                    target = (other, "/" if rng.random() < 0.3 else rng.choice(paths[other]))
                elif label in traps and r < broken_fraction + cross_fraction + 0.05:
                    target = (label, traps[label] + rng.choice(["", "/", "/2024/01"]))
                else:
                    target = (label, rng.choice(paths[label]))
                links.append(LinkSpec(target, nofollow=rng.random() < nofollow_fraction))
            rng.shuffle(links)
            pages[key].links = links
            if rng.random() < base_fraction:
                pages[key].base = rng.choice(sorted({_dir_of(p) for p in paths[label]}))

    robots: dict[str, RobotsSpec] = {}
    n_unavailable = (1 if origins >= 3 else 0) if unavailable_robots is None else unavailable_robots
    others = labels[1:]
    rng.shuffle(others)
    for label in others[:n_unavailable]:
        robots[label] = RobotsSpec("unavailable")
    for label in labels:
        if label in robots:
            continue
        if rng.random() >= robots_fraction:
            robots[label] = RobotsSpec("missing")
            continue
        text = _robots_text(rng, paths[label], user_agent)
        if len(labels) > 1 and rng.random() < redirect_robots_fraction:
            host = rng.choice([lb for lb in labels if lb != label])
            robots[label] = RobotsSpec("redirect", text, (host, f"/shared-robots/{label}.txt"))
        else:
            robots[label] = RobotsSpec("file", text)

    allowed_roots = [lb for lb in labels if robots[lb].kind != "unavailable"]
    seed_keys = [(lb, "/") for lb in allowed_roots[: max(1, seeds)]]
    return WebModel(origins=labels, pages=pages, robots=robots, seeds=seed_keys, traps=traps, user_agent=user_agent)


def mirror_across(model: WebModel, original: str, copy: str, tag: str = "twin") -> tuple[Key, Key, Key]:
    """Add a page of origin `original` mirrored on origin `copy`: (original, its copy, a page only the original's
    links reach). The original is linked from its root and links the copy absolutely, so the copy is reached only
    after the original; its other link is relative, so on the copy it would lead to `copy`'s own missing page.
    A crawler that recognises the copy's body (whichever node fetched the original) never follows it."""
    src, dst, only = (original, f"/{tag}-src"), (copy, f"/{tag}-copy"), (original, f"/{tag}-only")
    model.pages[only] = PageSpec(title=f"{tag} only")
    model.pages[src] = PageSpec(
        links=[LinkSpec(dst, href=f"{{{{origin:{copy}}}}}{dst[1]}"), LinkSpec(only, href=only[1].lstrip("/"))],
        title=f"{tag} original",
    )
    model.pages[dst] = PageSpec(mirror_of=src)
    model.pages[(original, "/")].links.append(LinkSpec(src, href=src[1]))
    return src, dst, only
