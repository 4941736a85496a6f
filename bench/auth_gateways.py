"""CPU per request added by data-plane authentication, end to end: smg-node and SMG side by side.

    .venv/bin/python -m bench.auth_gateways            # 5 repetitions, 10 s per run (~8 min)
    .venv/bin/python -m bench.auth_gateways --quick    # one repetition, 1 s per run (< 60 s)
    .venv/bin/python -m bench.auth_gateways --gateways smg-node --auths none,key,jwt

One zero-latency sim worker serves every run (as in bench/gateway_bench.py). A run is one gateway started
afresh in one auth mode, warmed up, then one point (200/20 streamed chat, 16 users, closed loop):

- ``none``: no credentials (smg-node open on loopback; SMG without keys).
- ``key``: smg-node with a bootstrap admin key from a file and, made through ``POST /admin/keys``, a
  ``user`` key of tenant ``bench``, which every request carries; SMG with ``--api-key`` and
  ``--tenant-api-key bench:<key>``, every request carrying the tenant key (both: a tenant-bound key).
- ``jwt`` (smg-node only: SMG checks JWTs on its control plane only): RS256 tokens of a local HTTPS issuer
  (discovery and JWKS, a throwaway CA), one token for every request. smg-node remembers a verified token for
  up to 60 s, so this is the cost of a token seen before; the first request of each token pays the
  signature check (bench/auth_cpu.py: ~90 us).

Runs alternate their order over repetitions so drift on the machine favours no mode. Per gateway the table
gives the gateway process tree's CPU per request without and with auth (medians over repetitions), the
difference (median of the per-repetition differences) in us and as % of the no-auth cost, and req/s.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field, replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import aiohttp

from bench import corpora, folders, launch, prompts, report
from bench.launch import LaunchError, Service
from bench.load import ChatLoad, run_async, run_point
from bench.proc import machine_busy_s, own_cpu_s, sample_tree
from bench.prompts import PromptPool
from bench.report import CpuUse, Metrics

BENCH_DIR = Path(__file__).resolve().parent
DEFAULT_OUT_DIR = BENCH_DIR / "out"
NONE, KEY, JWT = "none", "key", "jwt"
AUTHS = (NONE, KEY, JWT)
# SMG has no data-plane JWT check to compare with.
SUPPORTED = {report.NODE: AUTHS, report.SMG: (NONE, KEY)}
POOL_SIZE = 64
SETTLE_TIMEOUT_S = 20.0
FIRST_REQUEST_NUMBER = 1000
TENANT = "bench"
JWT_AUDIENCE = "smg-node"
# A token valid for the whole run: expiry is not what is measured.
JWT_LIFETIME_S = 24 * 3600


@dataclass(frozen=True, slots=True)
class AuthBenchConfig:
    gateways: tuple[str, ...] = (report.NODE, report.SMG)
    auths: tuple[str, ...] = AUTHS
    prompt_tokens: int = 200
    output_tokens: int = 20
    concurrency: int = 16
    repetitions: int = 5
    duration_s: float = 10.0
    warmup_s: float = 2.0
    ready_timeout_s: float = 90.0
    request_timeout_s: float = 60.0
    out_dir: Path = DEFAULT_OUT_DIR

    def variants(self) -> list[tuple[str, str]]:
        """(gateway, auth) pairs to run, in the order of an even repetition."""
        return [(g, a) for g in self.gateways for a in self.auths if a in SUPPORTED[g]]


QUICK = AuthBenchConfig(repetitions=1, duration_s=1.0, warmup_s=0.3)


@dataclass(frozen=True, slots=True)
class AuthRun:
    gateway: str
    auth: str
    repetition: int
    metrics: Metrics
    errors: tuple[str, ...]


@dataclass(slots=True)
class Outcome:
    runs: list[AuthRun] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def _bearer(token: str) -> tuple[tuple[str, str], ...]:
    return (("Authorization", f"Bearer {token}"),)


# --- a local OIDC issuer over HTTPS (the one tests/auth/test_jwt.py serves, on a thread here) ---


@dataclass(frozen=True, slots=True)
class Issuer:
    url: str
    ca_file: Path
    token: str  # RS256, tenant TENANT, audience JWT_AUDIENCE


@contextmanager
def local_issuer(workdir: Path) -> Iterator[Issuer]:
    """Discovery and JWKS over HTTPS on a loopback port, signed by a throwaway CA, served from a thread (the
    node fetches them once at start; nothing here is on the measured path)."""
    import jwt
    from cryptography.hazmat.primitives.asymmetric import rsa

    from tests.mesh.tls_certs import CertAuthority

    files = CertAuthority(workdir, "idp").issue("idp", hosts=["127.0.0.1"])
    private = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    jwk = {**json.loads(jwt.algorithms.RSAAlgorithm.to_jwk(private.public_key())), "kid": "k1", "use": "sig"}
    port = launch.free_port()
    url = f"https://127.0.0.1:{port}"
    documents = {
        "/.well-known/openid-configuration": {"issuer": url, "jwks_uri": f"{url}/jwks"},
        "/jwks": {"keys": [jwk]},
    }

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            document = documents.get(self.path)
            body = json.dumps(document).encode()
            self.send_response(200 if document else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(files.cert, files.key)
    server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, name="local-issuer", daemon=True)
    thread.start()
    now = int(time.time())
    claims = {"iss": url, "aud": JWT_AUDIENCE, "sub": "bench", "tenant": TENANT, "exp": now + JWT_LIFETIME_S}
    token = jwt.encode(claims, private, algorithm="RS256", headers={"kid": "k1"})
    try:
        yield Issuer(url=url, ca_file=files.ca, token=token)
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5.0)


# --- one run ---


@dataclass(frozen=True, slots=True)
class Secrets:
    admin_key_file: Path  # smg-node's bootstrap admin key
    admin_key: str
    smg_shared_key: str
    smg_tenant_key: str
    issuer: Issuer | None


def gateway_command(
    gateway: str, auth: str, port: int, worker_url: str, model_dir: Path, secrets: Secrets
) -> list[str]:
    """The gateway's command line in ``auth`` mode."""
    extra: tuple[str, ...] = ()
    if gateway == report.NODE and auth == KEY:
        extra = ("--auth-bootstrap-key-file", str(secrets.admin_key_file))
    elif gateway == report.NODE and auth == JWT:
        assert secrets.issuer is not None
        extra = (
            "--jwt-issuer", secrets.issuer.url,
            "--jwt-audience", JWT_AUDIENCE,
            "--jwt-ca-file", str(secrets.issuer.ca_file),
        )  # fmt: skip
    elif gateway == report.SMG and auth == KEY:
        extra = ("--api-key", secrets.smg_shared_key, "--tenant-api-key", f"{TENANT}:{secrets.smg_tenant_key}")
    return launch.GATEWAY_COMMANDS[gateway](port, worker_url, model_dir, extra)


async def _create_user_key(base_url: str, admin_key: str) -> str:
    headers = dict(_bearer(admin_key))
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as session,
        session.post(f"{base_url}/admin/keys", json={"tenant": TENANT, "role": "user"}, headers=headers) as r,
    ):
        if r.status != 201:
            raise LaunchError(f"POST /admin/keys answered {r.status}: {(await r.text())[:300]}")
        made = await r.json()
    return str(made["key"])


async def _anonymous_status(base_url: str, model: str) -> int:
    body = {"model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 1}
    async with (
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=10.0)) as session,
        session.post(f"{base_url}/v1/chat/completions", json=body) as r,
    ):
        await r.read()
        return r.status


def check_enforced(gateway: str, auth: str, base_url: str, model: str) -> None:
    """A run with auth is only worth its name if a request without credentials is refused.

    Raises:
        LaunchError: the gateway answered an anonymous chat request with anything but 401.
    """
    status = run_async(lambda: _anonymous_status(base_url, model))
    if status != 401:
        raise LaunchError(f"{gateway} in auth mode {auth!r} answered {status} to a request without credentials")


def request_headers(gateway: str, auth: str, base_url: str, secrets: Secrets) -> tuple[tuple[str, str], ...]:
    """What every measured request carries (for smg-node ``key``: a ``user`` key made on the running node).

    Raises:
        LaunchError: the admin API refused to make the key.
    """
    if auth == NONE:
        return ()
    if gateway == report.SMG:
        return _bearer(secrets.smg_tenant_key)
    if auth == JWT:
        assert secrets.issuer is not None
        return _bearer(secrets.issuer.token)
    return _bearer(run_async(lambda: _create_user_key(base_url, secrets.admin_key)))


def run_one(
    gateway: str,
    auth: str,
    repetition: int,
    config: AuthBenchConfig,
    worker: Service,
    worker_url: str,
    model_dir: Path,
    pool: PromptPool,
    secrets: Secrets,
    number: int,
    log_dir: Path,
) -> tuple[AuthRun, int]:
    """Start ``gateway`` in ``auth`` mode, warm it up, measure one point, stop it.

    Raises:
        LaunchError: the gateway did not start, refused the credentials, or died.
    """
    port = launch.free_port()
    base_url = f"http://127.0.0.1:{port}"
    cmd = gateway_command(gateway, auth, port, worker_url, model_dir, secrets)
    with launch.running(gateway, cmd, log_dir / f"{gateway}-{auth}-rep{repetition}.log") as service:
        # smg-node's user key is made on the running node: until then its bootstrap admin key (which may
        # do anything) checks readiness.
        ready = _bearer(secrets.admin_key) if (gateway, auth) == (report.NODE, KEY) else None
        ready = ready if ready is not None else request_headers(gateway, auth, base_url, secrets)
        model = launch.wait_gateway_ready(service, base_url, pool, config.ready_timeout_s, ready)
        headers = request_headers(gateway, auth, base_url, secrets)
        if auth != NONE:
            check_enforced(gateway, auth, base_url, model)
        launch.wait_idle(service, SETTLE_TIMEOUT_S)

        def load(duration_s: float, first: int, concurrency: int) -> ChatLoad:
            return ChatLoad(
                base_url=base_url,
                model=model,
                pool=pool,
                max_tokens=config.output_tokens,
                concurrency=concurrency,
                duration_s=duration_s,
                first_number=first,
                request_timeout_s=config.request_timeout_s,
                headers=headers,
            )

        warm = run_point(load(config.warmup_s, number, min(8, config.concurrency)))
        number = warm.next_number
        if warm.error_count:
            raise LaunchError(f"{gateway} {auth}: warm-up failed: {warm.errors[:1]}")
        launch.wait_idle(service, SETTLE_TIMEOUT_S)
        gw0, w0 = sample_tree(service.pid), sample_tree(worker.pid)
        busy0, own0 = machine_busy_s(), own_cpu_s()
        result = run_point(load(config.duration_s, number, config.concurrency))
        busy1, own1 = machine_busy_s(), own_cpu_s()
        gw1, w1 = sample_tree(service.pid), sample_tree(worker.pid)
        cpu = CpuUse(
            gateway_s=gw1.cpu_s - gw0.cpu_s,
            worker_s=w1.cpu_s - w0.cpu_s,
            driver_s=own1 - own0,
            machine_busy_s=busy1 - busy0,
        )
        metrics = report.measure(result, config.output_tokens, cpu, gw1.rss_bytes)
        if not service.alive():
            raise LaunchError(f"{gateway} died:\n{service.log_tail()}")
    _log(
        f"rep {repetition} {gateway:8} {auth:4} {metrics.req_s:8.1f} req/s  "
        f"cpu {metrics.gateway_cpu_ms_per_req:6.3f} ms/req  ok {metrics.requests:.0f} err {metrics.errors:.0f}  "
        f"other {metrics.other_cpu_pct:.0f}%"
    )
    return AuthRun(gateway, auth, repetition, metrics, result.errors), result.next_number


def run_bench(config: AuthBenchConfig) -> Outcome:
    outcome = Outcome()
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    log_dir = config.out_dir / "logs" / f"auth-{stamp}"
    model_dir = folders.prepare("llama3", config.out_dir / "models")
    tokenizer = prompts.load_tokenizer(model_dir)
    overhead = prompts.chat_template_overhead(model_dir, tokenizer)
    pool = corpora.build_pool("synthetic", tokenizer, overhead, config.prompt_tokens, POOL_SIZE)
    from node.auth.keys import new_key

    number = FIRST_REQUEST_NUMBER
    with ExitStack() as stack:
        workdir = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="auth-gateways-")))
        admin_key, _ = new_key()
        key_file = workdir / "bootstrap.key"
        key_file.write_text(admin_key + "\n")
        key_file.chmod(0o600)
        issuer = stack.enter_context(local_issuer(workdir)) if JWT in config.auths else None
        secrets = Secrets(key_file, admin_key, new_key()[0], new_key()[0], issuer)
        worker_port = launch.free_port()
        worker_url = f"grpc://127.0.0.1:{worker_port}"
        worker = stack.enter_context(
            launch.running("sim-worker", launch.sim_worker_command(worker_port, model_dir), log_dir / "sim.log")
        )
        launch.wait_port(worker, worker_port, config.ready_timeout_s)
        variants = config.variants()
        for repetition in range(config.repetitions):
            for gateway, auth in variants if repetition % 2 == 0 else reversed(variants):
                try:
                    run, number = run_one(
                        gateway, auth, repetition, config, worker, worker_url, model_dir, pool, secrets, number, log_dir
                    )
                except LaunchError as exc:
                    outcome.failures.append(f"repetition {repetition}, {gateway} {auth}: {exc}")
                    _log(f"FAILED {gateway} {auth} in repetition {repetition}: {exc}")
                    continue
                outcome.runs.append(run)
            if not worker.alive():
                outcome.failures.append(f"the sim worker died:\n{worker.log_tail()}")
                break
    return outcome


# --- reporting ---


@dataclass(frozen=True, slots=True)
class AuthCost:
    gateway: str
    auth: str
    base_cpu_ms: float  # median gateway CPU per request without auth
    auth_cpu_ms: float  # the same with this auth
    added_us: float  # median over repetitions of (with - without)
    added_pct: float  # added_us as % of base_cpu_ms
    base_req_s: float
    auth_req_s: float


def costs(runs: Sequence[AuthRun]) -> list[AuthCost]:
    """Per (gateway, auth other than none) with a no-auth baseline: the CPU added per request."""
    by: dict[tuple[str, str], dict[int, Metrics]] = {}
    for run in runs:
        by.setdefault((run.gateway, run.auth), {})[run.repetition] = run.metrics
    out = []
    for (gateway, auth), reps in by.items():
        base = by.get((gateway, NONE))
        if auth == NONE or base is None:
            continue
        paired = [reps[r].gateway_cpu_ms_per_req - base[r].gateway_cpu_ms_per_req for r in reps if r in base]
        base_cpu = report.median(m.gateway_cpu_ms_per_req for m in base.values())
        added_us = report.median(paired) * 1000
        out.append(
            AuthCost(
                gateway=gateway,
                auth=auth,
                base_cpu_ms=base_cpu,
                auth_cpu_ms=report.median(m.gateway_cpu_ms_per_req for m in reps.values()),
                added_us=added_us,
                added_pct=added_us / 10 / base_cpu if base_cpu else float("nan"),
                base_req_s=report.median(m.req_s for m in base.values()),
                auth_req_s=report.median(m.req_s for m in reps.values()),
            )
        )
    return out


def render(config: AuthBenchConfig, outcome: Outcome, command: str) -> str:
    lines = [
        f"- date: {dt.datetime.now(dt.UTC).strftime('%Y-%m-%d %H:%M UTC')}",
        f"- machine: {report.machine_line()}",
        f"- command: `{command}`",
        f"- versions: {report.versions_line()}",
        f"- point: {config.prompt_tokens}/{config.output_tokens} streamed chat, concurrency {config.concurrency}, "
        f"{config.duration_s:g} s closed loop per run, {config.repetitions} repetition(s), order alternating",
        "",
        "| gateway | auth | gw CPU ms/req, no auth | with auth | added µs/req | added % | req/s no auth | req/s auth |",
        "|---|---|---|---|---|---|---|---|",
    ]
    lines += [
        f"| {cost.gateway} | {cost.auth} | {cost.base_cpu_ms:.3f} | {cost.auth_cpu_ms:.3f} | "
        f"{cost.added_us:+.1f} | {cost.added_pct:+.1f}% | {cost.base_req_s:.1f} | {cost.auth_req_s:.1f} |"
        for cost in costs(outcome.runs)
    ]
    if outcome.failures:
        lines += ["", "Failures:", ""] + [f"- {failure[:500]}" for failure in outcome.failures]
    errors = sorted({e for run in outcome.runs for e in run.errors})
    if errors:
        lines += ["", "Request errors (first of each kind):", ""] + [f"- {e[:300]}" for e in errors[:10]]
    return "\n".join(lines) + "\n"


def _names(text: str) -> tuple[str, ...]:
    return tuple(part.strip() for part in text.split(",") if part.strip())


def parse_args(argv: Sequence[str] | None) -> AuthBenchConfig:
    parser = argparse.ArgumentParser(
        prog="python -m bench.auth_gateways", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="one repetition, 1 s per run (< 60 s)")
    parser.add_argument("--gateways", type=_names, help="comma-separated subset of: smg-node,SMG")
    parser.add_argument("--auths", type=_names, help=f"comma-separated subset of: {','.join(AUTHS)} (none is kept)")
    parser.add_argument("--prompt", type=int, dest="prompt_tokens", help="prompt tokens [200]")
    parser.add_argument("--output", type=int, dest="output_tokens", help="output tokens [20]")
    parser.add_argument("--concurrency", type=int, help="closed-loop users [16]")
    parser.add_argument("--reps", type=int, dest="repetitions", help="repetitions [5]")
    parser.add_argument("--duration-s", type=float, help="seconds of load per run [10]")
    parser.add_argument("--warmup-s", type=float, help="seconds of warm-up per run [2]")
    parser.add_argument("--out-dir", type=Path, help=f"where the table, raw JSON and logs go [{DEFAULT_OUT_DIR}]")
    args = parser.parse_args(argv)
    config = QUICK if args.quick else AuthBenchConfig()
    overrides: dict[str, object] = {}
    if args.gateways:
        unknown = [g for g in args.gateways if g not in SUPPORTED]
        if unknown:
            parser.error(f"unknown gateway(s) {unknown}; choose from {list(SUPPORTED)}")
        overrides["gateways"] = args.gateways
    if args.auths:
        unknown = [a for a in args.auths if a not in AUTHS]
        if unknown:
            parser.error(f"unknown auth mode(s) {unknown}; choose from {list(AUTHS)}")
        # The no-auth run is every difference's baseline.
        overrides["auths"] = (NONE, *(a for a in args.auths if a != NONE))
    for name in ("prompt_tokens", "output_tokens", "concurrency", "repetitions", "duration_s", "warmup_s", "out_dir"):
        value = getattr(args, name)
        if value is not None:
            overrides[name] = value
    return replace(config, **overrides)  # type: ignore[arg-type]


def main(argv: Sequence[str] | None = None) -> int:
    config = parse_args(argv)
    launch.exit_on_sigterm()
    command = launch.command_line("bench.auth_gateways", argv)
    config.out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        outcome = run_bench(config)
    except (LaunchError, corpora.CorpusError, OSError, subprocess.SubprocessError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    _log(f"done in {time.monotonic() - started:.0f} s")
    block = render(config, outcome, command)
    print(block)
    raw = {
        "config": {name: str(getattr(config, name)) if name == "out_dir" else getattr(config, name)
                   for name in AuthBenchConfig.__dataclass_fields__},
        "failures": outcome.failures,
        "runs": [
            {"gateway": r.gateway, "auth": r.auth, "repetition": r.repetition,
             "metrics": report.json_ready(_fields(r.metrics)), "errors": list(r.errors)}
            for r in outcome.runs
        ],
        "costs": [report.json_ready(_fields(cost)) for cost in costs(outcome.runs)],
    }  # fmt: skip
    report.save_outputs(config.out_dir, "auth_gateways", block, json.dumps(raw, indent=1))
    return 1 if outcome.failures or not outcome.runs else 0


def _fields(value: Metrics | AuthCost) -> dict[str, object]:
    return {name: getattr(value, name) for name in type(value).__dataclass_fields__}


if __name__ == "__main__":
    sys.exit(main())
