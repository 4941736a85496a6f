"""Worker URL validation and the network policy (pure), and the same checks on --worker flags at start-up."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from node.config import WorkerPoolConfig
from node.workers.worker_url import NetworkPolicy, parse_networks, parse_target

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("url", "authority", "tls"),
    [
        ("grpc://worker-1.gpu.svc:50051", "worker-1.gpu.svc:50051", False),
        ("grpcs://10.0.0.7:443", "10.0.0.7:443", True),
        ("grpc://[2001:db8::1]:1", "[2001:db8::1]:1", False),
        ("grpc://vllm_worker:65535", "vllm_worker:65535", False),  # compose service names have underscores
    ],
)
def test_good_urls_give_their_target(url: str, authority: str, tls: bool) -> None:
    target = parse_target(url)
    NetworkPolicy().check(url, target)
    assert (target.authority, target.tls) == (authority, tls)


@pytest.mark.parametrize(
    ("url", "why"),
    [
        ("http://h:1", "scheme"),
        ("grpc://user:pw@h:1", "user information"),
        ("grpc://a b:1", "spaces"),
        ("grpc://h:0", "port"),
        ("grpc://h:65536", "malformed"),
        ("grpc://h:080", "port"),
        ("grpc://h", "port"),
        ("grpc://h:1/", "path"),
        ("grpc://h:1/x", "path"),
        ("grpc://h:1?q=1", "query"),
        ("grpc://h:1#f", "fragment"),
        ("grpc://:1", "no host"),
        ("grpc://-h:1", "neither a hostname"),
        ("grpc://h..x:1", "neither a hostname"),
        ("grpc://1.2.3:1", "neither a hostname"),
        ("grpc://[h]:1", "malformed"),
        ("grpc://[10.0.0.1]:1", "brackets"),
        ("grpc://0.0.0.0:1", "unicast"),
        ("grpc://h\u00e9:1", "non-ASCII"),
    ],
)
def test_bad_urls_are_refused_saying_why(url: str, why: str) -> None:
    with pytest.raises(ValueError, match=why) as caught:
        parse_target(url)
    assert repr(url) in str(caught.value)


@pytest.mark.parametrize(
    "url", ["grpc://169.254.169.254:80", "grpc://[fd00:ec2::254]:80", "grpc://[::ffff:169.254.169.254]:80"]
)
def test_metadata_addresses_are_refused_unless_a_network_inside_them_is_allowed(url: str) -> None:
    target = parse_target(url)
    with pytest.raises(ValueError, match="link-local or metadata"):
        NetworkPolicy().check(url, target)
    with pytest.raises(ValueError, match="link-local or metadata"):  # "everything" does not open them
        NetworkPolicy(allowed=parse_networks(("0.0.0.0/0", "::/0"), "x")).check(url, target)
    NetworkPolicy(allowed=parse_networks(("169.254.169.254/32", "fd00:ec2::254/128"), "x")).check(url, target)


def test_allowed_networks_restrict_ip_targets_but_not_names() -> None:
    policy = NetworkPolicy(allowed=parse_networks(("10.0.0.0/8",), "worker_allowed_networks"))
    policy.check("grpc://10.1.2.3:1", parse_target("grpc://10.1.2.3:1"))
    policy.check("grpc://gpu-7:1", parse_target("grpc://gpu-7:1"))
    with pytest.raises(ValueError, match=r"outside the allowed worker networks \(10.0.0.0/8\)"):
        policy.check("grpc://192.168.1.1:1", parse_target("grpc://192.168.1.1:1"))
    with pytest.raises(ValueError, match=r"worker_allowed_networks: '10\.0\.0\.0/33'"):
        parse_networks(("10.0.0.0/33",), "worker_allowed_networks")


@given(st.ip_addresses(), st.integers(1, 65535), st.booleans())
def test_every_ip_and_port_round_trips(ip: object, port: int, tls: bool) -> None:
    host = f"[{ip}]" if ":" in str(ip) else str(ip)
    url = f"{'grpcs' if tls else 'grpc'}://{host}:{port}"
    if str(ip) in ("0.0.0.0", "::") or getattr(ip, "is_multicast", False):
        with pytest.raises(ValueError):
            parse_target(url)
        return
    target = parse_target(url)
    assert (target.authority, target.port, target.tls, target.ip) == (f"{host}:{port}", port, tls, ip)


def test_worker_flags_are_checked_at_load() -> None:
    with pytest.raises(ValueError, match="link-local"):
        WorkerPoolConfig(workers=("grpc://169.254.169.254:80",))
    with pytest.raises(ValueError, match="more than max_workers"):
        WorkerPoolConfig(workers=("grpc://a:1", "grpc://b:1"), max_workers=1)
    WorkerPoolConfig(workers=("grpc://169.254.169.254:80",), worker_allowed_networks=("169.254.169.254/32",))


@pytest.mark.parametrize("url", ["grpc://169.254.169.254:80", "grpc://a b:1", "grpc://h:0"])
def test_a_bad_worker_flag_stops_serve_with_a_one_line_error(url: str, tmp_path: Path) -> None:
    argv = [sys.executable, "-m", "node.cli", "serve", "--model-path", str(tmp_path), "--worker", url]
    done = subprocess.run(argv, check=False, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert f"error: worker URL {url!r}" in done.stderr
