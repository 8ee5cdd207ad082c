"""TLS, mutual TLS, the admin token and readiness, against real `hostring` processes on loopback.

A throwaway CA and certificates are made with the `openssl` CLI in a temporary directory. One certificate
(serverAuth + clientAuth, naming localhost and 127.0.0.1) serves every process, as the Kubernetes `tls`
component's single Secret does. Each test checks both sides: what is refused (plaintext, no client certificate,
a certificate from another CA, an admin call without or with a wrong token) and what is accepted.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from hostring.security import INSECURE, TlsConfig, admin_metadata
from hostring.v1 import coordinator_pb2 as cpb
from hostring.v1 import coordinator_pb2_grpc as cpb_grpc
from hostring.v1 import frontier_pb2 as pb
from hostring.v1 import frontier_pb2_grpc as pb_grpc
from hostring_testing.crawls import CrawlProcess, hostring_cmd, serve, wait_until

pytestmark = [pytest.mark.slow, pytest.mark.timeout(90)]

TOKEN = "test-admin-token-0123456789abcdef"
RPC_S = 5.0
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


# ============================================================================================== helpers


@dataclass(frozen=True)
class Pki:
    """Paths of a test CA, a leaf certificate signed by it, and a leaf signed by an unrelated CA."""

    ca: Path
    cert: Path
    key: Path
    rogue_cert: Path
    rogue_key: Path

    def flags(self) -> list[str]:
        """`--tls-cert/--tls-key/--tls-ca` for a process of this PKI (mutual TLS)."""
        return ["--tls-cert", str(self.cert), "--tls-key", str(self.key), "--tls-ca", str(self.ca)]

    def client(self) -> TlsConfig:
        return TlsConfig.from_files(str(self.cert), str(self.key), str(self.ca))


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30, check=False)
    assert done.returncode == 0, f"openssl {' '.join(args)}: {done.stderr}"


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-days", "2",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", "-subj", f"/CN={name}",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
             cwd=d)  # fmt: skip


def _leaf(d: Path, name: str, ca: str) -> None:
    (d / f"{name}.ext").write_text(
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth,clientAuth\nbasicConstraints=CA:FALSE\n"
    )
    _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", "-subj", f"/CN={name}", cwd=d)  # fmt: skip
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-out", f"{name}.crt", "-extfile", f"{name}.ext", cwd=d)  # fmt: skip


@pytest.fixture(scope="session")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    """A CA, a certificate for every hostring process, and a certificate from a CA nobody trusts."""
    if shutil.which("openssl") is None:
        pytest.skip("the openssl CLI is needed to make test certificates")
    d = tmp_path_factory.mktemp("pki")
    _ca(d, "ca")
    _leaf(d, "hostring", "ca")
    _ca(d, "rogue-ca")
    _leaf(d, "rogue", "rogue-ca")
    return Pki(d / "ca.crt", d / "hostring.crt", d / "hostring.key", d / "rogue.crt", d / "rogue.key")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(address: str, tls: TlsConfig = INSECURE, service: str = "") -> int:
    """The health service's answer for `service` ('' = the whole server)."""
    with tls.channel(address) as channel:
        return int(
            health_pb2_grpc.HealthStub(channel)
            .Check(health_pb2.HealthCheckRequest(service=service), timeout=RPC_S)
            .status
        )


def refused(call: Callable[[], object]) -> grpc.StatusCode:
    """The status code of a call that must fail."""
    try:
        call()
    except grpc.RpcError as e:
        return e.code()  # type: ignore[attr-defined,no-any-return]
    raise AssertionError("the call succeeded but should have been refused")


def stats(address: str, tls: TlsConfig) -> pb.StatsResponse:
    with tls.channel(address) as channel:
        return pb_grpc.FrontierStub(channel).Stats(pb.StatsRequest(), timeout=2.0)  # type: ignore[no-untyped-call]


# ============================================================================================== unit level


def test_tls_config_refuses_half_settings(tmp_path: Path, pki: Pki) -> None:
    from hostring.security import SecurityConfigError, load_admin_token

    with pytest.raises(SecurityConfigError, match="go together"):
        TlsConfig.from_files(cert=str(pki.cert))
    with pytest.raises(SecurityConfigError, match="cannot read"):
        TlsConfig.from_files(ca=str(tmp_path / "missing.pem"))
    with pytest.raises(SecurityConfigError, match="needs --tls-cert"):
        TlsConfig.from_files(ca=str(pki.ca)).server_credentials()
    assert not INSECURE.enabled and pki.client().mutual
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    assert load_admin_token(str(token_file), {}) == TOKEN
    assert load_admin_token(None, {"HOSTRING_ADMIN_TOKEN": " t "}) == "t"
    assert load_admin_token(None, {}) is None
    assert admin_metadata(None) == ()


# ============================================================================================== node


def test_node_mtls_and_admin_token(tmp_path: Path, pki: Pki, processes: list[CrawlProcess]) -> None:
    token_file = tmp_path / "admin-token"
    token_file.write_text(TOKEN + "\n")
    node, port = serve(
        [
            "node",
            "--store",
            f"sqlite:///{tmp_path / 'n.sqlite3'}",
            "--listen",
            "127.0.0.1:0",
            "--admin-token-file",
            str(token_file),
            *pki.flags(),
        ],
        tmp_path,
        "node",
    )
    processes.append(node)
    addr = f"127.0.0.1:{port}"
    good = pki.client()

    # Refused: plaintext, TLS without a client certificate, a client certificate from another CA.
    assert refused(lambda: stats(addr, INSECURE)) == grpc.StatusCode.UNAVAILABLE
    assert refused(lambda: stats(addr, TlsConfig.from_files(ca=str(pki.ca)))) == grpc.StatusCode.UNAVAILABLE
    rogue = TlsConfig.from_files(str(pki.rogue_cert), str(pki.rogue_key), str(pki.ca))
    assert refused(lambda: stats(addr, rogue)) == grpc.StatusCode.UNAVAILABLE
    # ... and a client that does not trust the server's CA refuses the server.
    distrust = TlsConfig.from_files(str(pki.cert), str(pki.key), str(pki.rogue_cert))
    assert refused(lambda: stats(addr, distrust)) == grpc.StatusCode.UNAVAILABLE

    # Accepted: the proper client certificate. A standalone node owns everything: SERVING.
    assert stats(addr, good).node_id == "node-0"
    assert health(addr, good) == SERVING
    with good.channel(addr) as channel:
        stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
        stub.Discover(pb.DiscoverRequest(links=[pb.Link(observed="http://a.example/", seed=True)]), timeout=RPC_S)
        pause = pb.PauseHostRequest(host="a.example", paused=True)
        policy = pb.SetHostPolicyRequest(host="a.example", min_delay_s=3.0, concurrency=0)
        for call, request in ((stub.PauseHost, pause), (stub.SetHostPolicy, policy)):
            with pytest.raises(grpc.RpcError) as missing:
                call(request, timeout=RPC_S)
            assert missing.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "authorization: Bearer" in missing.value.details()
            with pytest.raises(grpc.RpcError) as wrong:
                call(request, timeout=RPC_S, metadata=admin_metadata("not-the-token"))
            assert wrong.value.code() == grpc.StatusCode.UNAUTHENTICATED
            assert "wrong admin token" in wrong.value.details()
            assert TOKEN not in wrong.value.details()
        assert stub.PauseHost(pause, timeout=RPC_S, metadata=admin_metadata(TOKEN)).paused
        assert stub.SetHostPolicy(policy, timeout=RPC_S, metadata=admin_metadata(TOKEN)).min_delay_s == 3.0
        # Inspection stays open to anyone holding a client certificate.
        assert stub.GetHost(pb.GetHostRequest(host="a.example"), timeout=RPC_S).paused
        assert stub.Stats(pb.StatsRequest(), timeout=RPC_S).hosts == 1


def test_node_without_token_leaves_admin_calls_open(
    tmp_path: Path, processes: list[CrawlProcess], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("HOSTRING_ADMIN_TOKEN", raising=False)
    node, port = serve(["node", "--store", "memory://", "--listen", "127.0.0.1:0"], tmp_path, "node")
    processes.append(node)
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.FrontierStub(channel)  # type: ignore[no-untyped-call]
        stub.Discover(pb.DiscoverRequest(links=[pb.Link(observed="http://b.example/", seed=True)]), timeout=RPC_S)
        assert stub.PauseHost(pb.PauseHostRequest(host="b.example", paused=True), timeout=RPC_S).paused
    assert "admin calls open" in node.stderr()


# ============================================================================================== cluster


def test_coordinator_mtls_token_and_node_readiness(
    tmp_path: Path, pki: Pki, processes: list[CrawlProcess], empty_redis: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A clustered node is NOT_SERVING until it holds a ring; it joins a TLS coordinator with the token."""
    monkeypatch.setenv("HOSTRING_ADMIN_TOKEN", TOKEN)  # inherited by both processes
    coord_port = free_port()
    coord_addr = f"127.0.0.1:{coord_port}"
    node, node_port = serve(
        [
            "node",
            "--coordinator",
            coord_addr,
            "--id",
            "node-tls",
            "--store",
            empty_redis,
            "--listen",
            "127.0.0.1:0",
            *pki.flags(),
        ],
        tmp_path,
        "node",
    )
    processes.append(node)
    node_addr = f"127.0.0.1:{node_port}"
    good = pki.client()
    # No coordinator yet: the node runs and answers, but does not own a slice.
    deadline = time.monotonic() + 1.0
    while time.monotonic() < deadline:
        assert health(node_addr, good) == NOT_SERVING
        assert health(node_addr, good, "hostring.v1.Frontier") == NOT_SERVING
        time.sleep(0.2)

    coord, port = serve(
        ["coordinator", "--listen", coord_addr, "--heartbeat-timeout", "3", *pki.flags()], tmp_path, "coordinator"
    )
    processes.append(coord)
    assert port == coord_port
    wait_until(lambda: health(node_addr, good) == SERVING, 20.0, "the node to own its slice")
    assert health(coord_addr, good) == SERVING

    with contextlib.ExitStack() as stack:
        plain = stack.enter_context(grpc.insecure_channel(coord_addr))
        certless = stack.enter_context(TlsConfig.from_files(ca=str(pki.ca)).channel(coord_addr))
        for channel in (plain, certless):
            stub = cpb_grpc.CoordinatorStub(channel)  # type: ignore[no-untyped-call]
            assert refused(lambda s=stub: s.GetRing(cpb.GetRingRequest(), timeout=2.0)) == grpc.StatusCode.UNAVAILABLE
        stub = cpb_grpc.CoordinatorStub(stack.enter_context(good.channel(coord_addr)))  # type: ignore[no-untyped-call]
        ring = stub.GetRing(cpb.GetRingRequest(), timeout=RPC_S)
        assert [m.node_id for m in ring.members] == ["node-tls"]
        join = cpb.RegisterRequest(node_id="intruder", address="127.0.0.1:9", weight=1)
        assert refused(lambda: stub.Register(join, timeout=RPC_S)) == grpc.StatusCode.UNAUTHENTICATED
        bad = admin_metadata("guess")
        assert refused(lambda: stub.Register(join, timeout=RPC_S, metadata=bad)) == grpc.StatusCode.UNAUTHENTICATED
        leave = cpb.LeaveRequest(node_id="node-tls")
        assert refused(lambda: stub.Leave(leave, timeout=RPC_S)) == grpc.StatusCode.UNAUTHENTICATED
        assert [m.node_id for m in stub.GetRing(cpb.GetRingRequest(), timeout=RPC_S).members] == ["node-tls"]
        # With the token a membership change goes through.
        joined = stub.Register(join, timeout=RPC_S, metadata=admin_metadata(TOKEN))
        assert {m.node_id for m in joined.ring.members} == {"node-tls", "intruder"}
        assert stub.Leave(cpb.LeaveRequest(node_id="intruder"), timeout=RPC_S, metadata=admin_metadata(TOKEN)).left

    # The status command speaks mTLS too.
    done = subprocess.run(
        hostring_cmd("status", "--coordinator", coord_addr, *pki.flags()),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "node-tls" in done.stdout and "unreachable" not in done.stdout
    # Links routed as a worker routes them (ring from the coordinator, then the owning node), over mTLS.
    seeded = subprocess.run(
        hostring_cmd("seed", "--coordinator", coord_addr, *pki.flags(), "http://a.example/"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert seeded.returncode == 0 and "seeded 1 URL" in seeded.stdout, seeded.stderr
    assert stats(node_addr, good).hosts == 1
    plain_status = subprocess.run(
        hostring_cmd("status", "--coordinator", coord_addr, "--timeout", "2"),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert plain_status.returncode == 1 and "UNAVAILABLE" in plain_status.stderr
