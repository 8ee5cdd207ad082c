"""A Scrapy request as Link.payload bytes and back: what survives the trip through hostring.

Scrapy's disk queues keep `Request.to_dict(spider=...)`: every attribute, callbacks and errbacks by the name
of the spider method. The payload is the same dict with three differences:

- JSON, not pickle: a payload another process wrote must not be able to run code in the reader. Meta,
  cb_kwargs and cookies may hold str, int, float, bool, None, bytes, lists (tuples arrive as lists) and dicts
  with str keys; anything else is refused by name (RequestNotSerializable);
- only what differs from a fresh request of the same class is kept, so `Request(url)` travels as no bytes;
- no URL (the lease says what to fetch: hostring's normalised URL, or a redirect target) and none of the meta
  that only describes one download (TRANSIENT_META: depth comes from hostring's link depth instead).
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Callable
from typing import Any

from scrapy import Request, Spider
from scrapy.utils.misc import load_object

from hostring.limits import MAX_LINK_PAYLOAD_BYTES

PAYLOAD_VERSION = 1
META_KEY = "hostring"
"""request.meta key of the lease a request was handed out under (never serialised)."""
PARENT_KEY = "hostring_parent"
"""request.meta key of a request a page's callback yielded: that page's lease (never serialised)."""
TRANSIENT_META = frozenset(
    {
        META_KEY,
        PARENT_KEY,
        "depth",
        "is_start_request",
        "download_slot",
        "download_latency",
        "dont_redirect",
        "dont_retry",
        "dont_obey_robotstxt",
        "redirect_urls",
        "redirect_reasons",
        "redirect_times",
        "retry_times",
        "_auth_proxy",
    }
)
_BYTES_TAG = "$bytes"
_MAX_NESTING = 64


class RequestNotSerializable(ValueError):
    """A request hostring cannot carry to another process; the message names the request and the part."""


class BadPayload(ValueError):
    """A leased payload this spider cannot turn back into a request (another spider's, or damaged)."""


def encode(request: Request, spider: Spider) -> bytes:
    """The payload of `request`: empty for a plain GET with default everything; RequestNotSerializable if it
    cannot travel or is larger than hostring.limits.MAX_LINK_PAYLOAD_BYTES."""
    cls = type(request)
    out: dict[str, Any] = {}
    if cls is not Request:
        out["_class"] = f"{cls.__module__}.{cls.__qualname__}"
    defaults = _defaults(cls)
    for attr in cls.attributes:
        if attr == "url":
            continue
        value = getattr(request, attr)
        if attr in ("callback", "errback"):
            if value is not None:
                out[attr] = _method_name(request, spider, attr, value)
            continue
        if attr == "headers":
            value = {k.decode("latin-1"): [v.decode("latin-1") for v in vs] for k, vs in request.headers.items()}
        elif attr == "meta":
            value = {k: v for k, v in request.meta.items() if k not in TRANSIENT_META}
        if defaults is not None and value == defaults.get(attr):
            continue
        out[attr] = _jsonable(value, attr, request)
    if not out:
        return b""
    out["v"] = PAYLOAD_VERSION
    data = json.dumps(out, separators=(",", ":"), ensure_ascii=False).encode("utf-8")
    if len(data) > MAX_LINK_PAYLOAD_BYTES:
        raise RequestNotSerializable(
            f"{_name(request)}: its serialised form is {len(data)} bytes, over hostring's {MAX_LINK_PAYLOAD_BYTES} "
            "(large meta, cookies or body): keep bulky data out of the request, e.g. in an item pipeline"
        )
    return data


def decode(payload: bytes, url: str, spider: Spider) -> Request:
    """The request a payload describes, for `url`; BadPayload when this spider cannot rebuild it."""
    if not payload:
        return Request(url)
    try:
        d = json.loads(payload)
    except (ValueError, UnicodeDecodeError) as e:
        raise BadPayload(f"{url}: payload is not JSON: {e}") from e
    if not isinstance(d, dict) or d.get("v") != PAYLOAD_VERSION:
        raise BadPayload(f"{url}: not a version-{PAYLOAD_VERSION} hostring.scrapy payload")
    cls: type[Request] = Request
    if "_class" in d:
        try:
            loaded = load_object(str(d["_class"]))
        except (ImportError, NameError, ValueError, AttributeError) as e:
            raise BadPayload(f"{url}: request class {d['_class']!r} cannot be imported here: {e}") from e
        if not (isinstance(loaded, type) and issubclass(loaded, Request)):
            raise BadPayload(f"{url}: {d['_class']!r} is not a scrapy.Request class")
        cls = loaded
    kwargs: dict[str, Any] = {}
    try:
        for attr in cls.attributes:
            if attr == "url" or attr not in d:
                continue
            value = d[attr]
            if attr in ("callback", "errback"):
                method = getattr(spider, str(value), None)
                if not callable(method):
                    raise BadPayload(f"{url}: spider {spider.name!r} has no method {value!r} (the {attr})")
                kwargs[attr] = method
            elif attr == "headers":
                kwargs[attr] = {_latin1(k): [_latin1(v) for v in vs] for k, vs in value.items()}
            else:
                kwargs[attr] = _from_json(value)
        return cls(url=url, **kwargs)
    except BadPayload:
        raise
    except (TypeError, ValueError, AttributeError, binascii.Error) as e:
        raise BadPayload(f"{url}: payload does not make a {cls.__qualname__}: {e}") from e


def _latin1(text: object) -> bytes:
    return str(text).encode("latin-1")


def _name(request: Request) -> str:
    return f"<{request.method} {request.url}>"


_DEFAULTS: dict[type[Request], dict[str, Any] | None] = {}


def _defaults(cls: type[Request]) -> dict[str, Any] | None:
    """The attributes of a fresh request of `cls` (as encode() renders them), or None if one cannot be made."""
    if cls in _DEFAULTS:
        return _DEFAULTS[cls]
    out: dict[str, Any] | None
    try:
        fresh = cls("http://hostring.invalid/")
    except Exception:  # a subclass with required arguments: every attribute is kept
        out = None
    else:
        out = {attr: getattr(fresh, attr) for attr in cls.attributes}
        out["headers"] = {k.decode("latin-1"): [v.decode("latin-1") for v in vs] for k, vs in fresh.headers.items()}
        out["meta"] = dict(fresh.meta)
    _DEFAULTS[cls] = out
    return out


def _method_name(request: Request, spider: Spider, attr: str, fn: Callable[..., Any]) -> str:
    """The name under which `spider` has the bound method `fn`; RequestNotSerializable for anything else."""
    func = getattr(fn, "__func__", None)
    if func is not None and getattr(fn, "__self__", None) is spider:
        name = str(getattr(func, "__name__", ""))
        if getattr(getattr(spider, name, None), "__func__", None) is func:
            return name
        try:  # the method is bound under another name: Scrapy's own lookup finds it
            found = request.to_dict(spider=spider)[attr]
        except ValueError:
            pass
        else:
            if isinstance(found, str):
                return found
    raise RequestNotSerializable(
        f"{_name(request)}: its {attr} {fn!r} is not a method of spider {spider.name!r}. hostring may hand the "
        "request to another process, which finds callbacks by name: use a spider method"
    )


def _jsonable(value: Any, path: str, request: Request, depth: int = 0) -> Any:
    """`value` as JSON data (bytes tagged); RequestNotSerializable naming the path of the first bad part."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if depth > _MAX_NESTING:
        raise RequestNotSerializable(f"{_name(request)}: {path} is nested more than {_MAX_NESTING} levels deep")
    if isinstance(value, (bytes, bytearray)):
        return {_BYTES_TAG: base64.b64encode(value).decode("ascii")}
    if isinstance(value, (list, tuple)):
        return [_jsonable(v, f"{path}[{i}]", request, depth + 1) for i, v in enumerate(value)]
    if isinstance(value, dict):
        out: dict[str, Any] = {}
        for k, v in value.items():
            if not isinstance(k, str):
                raise RequestNotSerializable(f"{_name(request)}: {path} has a key {k!r} that is not a str")
            out[k] = _jsonable(v, f"{path}[{k!r}]", request, depth + 1)
        if len(out) == 1 and _BYTES_TAG in out:
            raise RequestNotSerializable(f"{_name(request)}: {path} uses the reserved key {_BYTES_TAG!r}")
        return out
    raise RequestNotSerializable(
        f"{_name(request)}: {path} is a {type(value).__module__}.{type(value).__qualname__}, which hostring cannot "
        "carry between processes (it stores requests as JSON: str, int, float, bool, None, bytes, lists and dicts "
        "with str keys)"
    )


def _from_json(value: Any) -> Any:
    if isinstance(value, list):
        return [_from_json(v) for v in value]
    if isinstance(value, dict):
        if len(value) == 1 and _BYTES_TAG in value:
            return base64.b64decode(value[_BYTES_TAG], validate=True)
        return {k: _from_json(v) for k, v in value.items()}
    return value
