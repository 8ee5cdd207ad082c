"""Test support shared by tests, benchmarks and `hostring demo`: the ground floor beside the kernel.

- the loopback test web: ``server`` (LocalWeb and its request log), ``pages`` (pages, page helpers, the
  calendar trap), ``identity`` (the oracle's own URL identity), ``robots`` (the oracle's own robots rules),
  ``model`` (generated webs: WebModel, rendering, random models), ``oracle`` (brute-force BFS over a model),
  ``samples`` (a random web and the demo's sample web); ``python -m hostring_testing`` serves one;
- ``crawls``: run `hostring crawl` and other `hostring` commands as processes, read what they wrote, judge
  the server's log;
- ``proc``: the one process wrapper (a child in its own process group, output to files);
- ``cluster``: the one cluster harness (coordinator, nodes and workers as `hostring` processes);
- ``redis_server``: Redis servers for tests and benchmarks (a redis-server of our own, a container, a Cluster).

It imports no service package and not the launcher: processes are driven through ``python -m hostring_cli``
and spoken to through the kernel's gRPC stubs (``hostring.v1``). The names below are the test web's; import
the other modules by name.
"""

from hostring_testing.identity import canonical_target
from hostring_testing.model import LinkSpec, PageSpec, RobotsSpec, WebModel, random_model, render_model
from hostring_testing.oracle import Oracle, needed_depth, oracle_for
from hostring_testing.pages import (
    Key,
    Page,
    Site,
    bomb_page,
    compressed_page,
    html_page,
    redirect_page,
    robots_page,
)
from hostring_testing.robots import robots_allowed
from hostring_testing.samples import random_web, sample_model, sample_oracle, sample_web
from hostring_testing.server import CountingWeb, Hit, LocalWeb

__all__ = [
    "CountingWeb",
    "Hit",
    "Key",
    "LinkSpec",
    "LocalWeb",
    "Oracle",
    "Page",
    "PageSpec",
    "RobotsSpec",
    "Site",
    "WebModel",
    "bomb_page",
    "canonical_target",
    "compressed_page",
    "html_page",
    "needed_depth",
    "oracle_for",
    "random_model",
    "random_web",
    "redirect_page",
    "render_model",
    "robots_allowed",
    "robots_page",
    "sample_model",
    "sample_oracle",
    "sample_web",
]
