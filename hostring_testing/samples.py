"""Ready-made webs: a deterministic random web with its oracle, and the sample web `hostring demo` crawls."""

from __future__ import annotations

from typing import Any

from hostring_testing.model import LinkSpec, PageSpec, RobotsSpec, WebModel, random_model, render_model
from hostring_testing.oracle import Oracle, oracle_for
from hostring_testing.pages import Key, Site

__all__ = ["random_web", "sample_model", "sample_oracle", "sample_web"]


def random_web(seed: int, **kwargs: Any) -> tuple[dict[str, Site], Oracle]:
    """Sites and their Oracle for a deterministic random web; keyword arguments go to `random_model`."""
    model = random_model(seed, **kwargs)
    return render_model(model, seed), oracle_for(model)


# ----------------------------------------------------------------------------------------------------
# The demo web


_SAMPLE: dict[str, list[tuple[str, str, list[str]]]] = {
    # label: [(path, title, links)]; a link is "path" (same origin) or "label:path"; "!" marks rel=nofollow.
    "news": [
        ("/", "Harbor Town News", ["/local/", "/sports/", "/about", "/drafts/", "docs:/", "blog:/", "!shop:/"]),
        ("/local/", "Local news", ["/local/ferry-schedule", "/local/market-day", "/local/council-vote"]),
        ("/local/ferry-schedule", "New ferry schedule", ["/local/", "docs:/latest/guide"]),
        ("/local/market-day", "Market day moves to Saturday", ["shop:/", "/local/council-vote"]),
        ("/local/council-vote", "Council votes on the sea wall", ["/local/", "/drafts/budget-leak"]),
        ("/sports/", "Sports", ["/sports/regatta-results", "/sports/youth-league"]),
        ("/sports/regatta-results", "Regatta results", ["/sports/", "blog:/2024/sailing-notes"]),
        ("/sports/youth-league", "Youth league opens", ["/sports/"]),
        ("/drafts/", "Drafts", ["/drafts/budget-leak"]),
        ("/drafts/budget-leak", "Unpublished: budget", ["/"]),
        ("/drafts/press-kit", "Press kit", ["/about"]),
        ("/about", "About the paper", ["/", "/drafts/press-kit"]),
    ],
    "docs": [
        (
            "/",
            "Lantern documentation",
            ["/latest/guide", "/v1/guide", "/latest/faq", "/latest/api/", "/legacy/", "news:/"],
        ),
        ("/latest/guide", "User guide", ["/latest/faq", "/latest/api/", "/"]),
        ("/latest/faq", "Questions and answers", ["/latest/guide", "/latest/api/", "/~maintainers/"]),
        ("/latest/api/", "API reference", ["/latest/api/client", "/latest/api/server", "/print/faq"]),
        ("/latest/api/client", "Client API", ["/latest/api/"]),
        ("/latest/api/server", "Server API", ["/latest/api/", "/latest/api/client"]),
        ("/~maintainers/", "Maintainers", ["/"]),
        ("/legacy/", "Legacy documents", ["/legacy/old-spec"]),
        ("/legacy/old-spec", "Old specification", ["/"]),
    ],
    "shop": [
        (
            "/",
            "Chandlery shop",
            ["/catalog?page=1", "/catalog?page=2", "/catalog?sort=price", "/events", "/contact", "/cartography-maps"],
        ),
        ("/catalog?page=1", "Catalog, page 1", ["/items/lantern", "/items/rope", "/catalog?page=2"]),
        ("/catalog?page=2", "Catalog, page 2", ["/items/compass", "/items/oilskin", "/catalog?page=1"]),
        ("/catalog?sort=price", "Catalog by price", ["/items/lantern"]),
        ("/items/lantern", "Storm lantern", ["/catalog?page=1", "/cart"]),
        ("/items/rope", "Manila rope", ["/catalog?page=1", "/cart"]),
        ("/items/compass", "Brass compass", ["/catalog?page=2", "/cart"]),
        ("/items/oilskin", "Oilskin coat", ["/catalog?page=2", "/cart"]),
        ("/cart", "Your cart", ["/"]),
        ("/cartography-maps", "Charts and maps", ["/"]),
        ("/contact", "Contact", ["/", "news:/local/market-day"]),
    ],
    "blog": [
        ("/", "A sailor's notebook", ["/2024/sailing-notes", "/2024/knots", "/old-home", "/about"]),
        ("/2024/sailing-notes", "Sailing notes", ["/", "/2024/knots", "news:/sports/regatta-results"]),
        ("/2024/knots", "Five knots worth knowing", ["/2024/sailing-notes", "!/2024/secret-draft"]),
        ("/2024/secret-draft", "Draft", ["/"]),
        ("/about", "About me", ["/"]),
    ],
}

_SAMPLE_ROBOTS = {
    "news": "# Harbor Town News\nUser-agent: *\nDisallow: /drafts/\nAllow: /drafts/press-kit\n\n"
    "User-agent: archive-bot\nCrawl-delay: 30\nDisallow: /sports/\n",
    "shop": "User-agent: *\nDisallow: /*?sort=\nDisallow: /cart\n",
}


def sample_model(user_agent: str = "hostring") -> WebModel:
    """The demo web: 4 origins, ~37 pages, robots rules, a cross-origin 301, a calendar trap, mirrors."""
    pages: dict[Key, PageSpec] = {}
    for label, rows in _SAMPLE.items():
        for path, title, links in rows:
            specs = []
            for ref in links:
                nofollow = ref.startswith("!")
                ref = ref.lstrip("!")
                t_label, _, t_path = ref.rpartition(":") if not ref.startswith("/") else ("", "", ref)
                specs.append(LinkSpec((t_label or label, t_path), nofollow=nofollow))
            pages[(label, path)] = PageSpec(links=specs, title=title)
    pages[("docs", "/v1/guide")] = PageSpec(mirror_of=("docs", "/latest/guide"), title="User guide")
    pages[("docs", "/print/faq")] = PageSpec(mirror_of=("docs", "/latest/faq"), title="Questions and answers")
    pages[("docs", "/legacy/")].meta_nofollow = True
    pages[("blog", "/old-home")] = PageSpec(redirect_to=("news", "/"), redirect_status=301)
    robots = {label: RobotsSpec("file", text) for label, text in _SAMPLE_ROBOTS.items()}
    robots.update({"docs": RobotsSpec("missing"), "blog": RobotsSpec("missing")})
    return WebModel(
        origins=list(_SAMPLE),
        pages=pages,
        robots=robots,
        seeds=[("news", "/")],
        traps={"shop": "/events"},
        user_agent=user_agent,
    )


def sample_web() -> dict[str, Site]:
    """The Sites of the demo web (`hostring demo`)."""
    return render_model(sample_model(), seed=7)


def sample_oracle(user_agent: str = "hostring") -> Oracle:
    """What a correct crawler fetches from the demo web's seed."""
    return oracle_for(sample_model(user_agent))
