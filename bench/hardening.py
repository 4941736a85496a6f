"""Legitimate requests while a node is under connection abuse (issue 11): success rate, p99, the node's peak RSS.

A real node (``python -m node.cli serve`` from ``--code-dir``, so an older checkout can be measured the same way)
in front of a simulated worker, both separate processes. For each pattern, 4 closed-loop users send small chat
completions for ``--duration-s`` while the abuse runs:

- ``baseline``: no abuse;
- ``idle``: ``--idle`` connections that never send a byte, reopened whenever the node closes one (an attacker
  keeps the pressure up);
- ``slowloris``: ``--slowloris`` connections dribbling a header byte per second, reopened likewise;
- ``nonreading``: ``--non-reading`` streaming requests of ``--max-tokens`` tokens whose client never reads,
  reopened likewise.

The node's RSS is sampled every 100 ms; the report gives its peak against the baseline pattern's peak.

    python -m bench.hardening --duration-s 30            # this checkout
    python -m bench.hardening --code-dir /tmp/old-node   # another one (git archive <rev> | tar -x -C DIR)
    python -m bench.hardening --node-nofile 1024         # idle connections past the node's fd limit
    python -m bench.hardening --failover 40              # time for a hung worker's request to fail over

``--failover N`` measures something else: two simulated workers, one of them ``--fault hang`` (health checks
pass, Generate never answers), the node with ``--first-token-timeout-s`` (2 s here); one user sends ``N``
streamed chat requests in a row, 0.5 s apart. A request routed first to the hung worker waits out the
first-token deadline and is retried on the healthy one; its time to the last byte is the failover time. The
node takes a worker that timed out out of rotation until its next passing health check, and opens its circuit
after ``circuit_failures_to_open`` timeouts (pass ``--node-flag=--circuit-failures-to-open=1000000`` for more
samples).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from bench.launch import free_port, running, wait_port
from bench.proc import sample_tree

LEGIT_USERS = 4
LEGIT_TIMEOUT_S = 30.0
RSS_SAMPLE_S = 0.1
DRIBBLE_S = 1.0
NON_READING_RCVBUF_BYTES = 4096
JSON = {"Content-Type": "application/json"}
FAILOVER_GAP_S = 0.5


@dataclass
class PatternResult:
    pattern: str
    ok: int
    failed: int
    p50_ms: float
    p99_ms: float
    peak_rss_mib: float
    errors: list[str]

    @property
    def success_rate(self) -> float:
        total = self.ok + self.failed
        return self.ok / total if total else 0.0


def _chat(model: str, max_tokens: int, stream: bool) -> bytes:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "Tell me a story"}],
        "max_tokens": max_tokens,
        "ignore_eos": True,
        "stream": stream,
    }
    return json.dumps(body).encode()


def _raw_post(body: bytes) -> bytes:
    head = (
        "POST /v1/chat/completions HTTP/1.1\r\nHost: node\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    )
    return head.encode() + body


async def _until_closed(sock: socket.socket, stop: asyncio.Event) -> None:
    """Wait until the peer closes ``sock`` (EOF/reset, seen as readable) or ``stop``; never reads data."""
    loop = asyncio.get_running_loop()
    closed = loop.create_future()

    def check() -> None:
        try:
            if sock.recv(1, socket.MSG_PEEK) == b"" and not closed.done():
                closed.set_result(None)
        except BlockingIOError:
            return
        except OSError:
            if not closed.done():
                closed.set_result(None)

    # Readable means data (which a non-reading client leaves queued: poll it) or EOF/reset.
    while not stop.is_set() and not closed.done():
        check()
        await asyncio.sleep(0.5)


async def _abuser(port: int, stop: asyncio.Event, kind: str, payload: bytes) -> None:
    """One abusive connection, reopened each time the node closes it, until ``stop``."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        sock = socket.socket()
        if kind == "nonreading":
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, NON_READING_RCVBUF_BYTES)
        sock.setblocking(False)
        try:
            await loop.sock_connect(sock, ("127.0.0.1", port))
            if kind == "nonreading":
                await loop.sock_sendall(sock, payload)
                await _until_closed(sock, stop)
            elif kind == "slowloris":
                for k in range(len(payload)):
                    if stop.is_set():
                        break
                    await loop.sock_sendall(sock, payload[k : k + 1])
                    await asyncio.sleep(DRIBBLE_S)
            else:
                await _until_closed(sock, stop)
        except OSError:
            await asyncio.sleep(0.1)
        finally:
            sock.close()


async def _legit(url: str, model: str, stop: asyncio.Event, latencies: list[float], errors: list[str]) -> None:
    timeout = aiohttp.ClientTimeout(total=LEGIT_TIMEOUT_S)
    async with aiohttp.ClientSession(timeout=timeout) as session:
        while not stop.is_set():
            started = time.monotonic()
            try:
                async with session.post(
                    url + "/v1/chat/completions",
                    data=_chat(model, 16, False),
                    headers={"Content-Type": "application/json"},
                ) as resp:
                    body = await resp.read()
                    if resp.status != 200:
                        raise RuntimeError(f"{resp.status}: {body[:200]!r}")
                latencies.append(time.monotonic() - started)
            except Exception as exc:  # every failure is counted and a few are reported
                errors.append(repr(exc)[:200])
                await asyncio.sleep(0.1)


async def _run_pattern(
    pattern: str, count: int, url: str, port: int, model: str, max_tokens: int, duration_s: float, node_pid: int
) -> PatternResult:
    stop = asyncio.Event()
    payloads = {
        "idle": b"",
        "slowloris": b"GET /health HTTP/1.1\r\nHost: node\r\nX-Padding: " + b"a" * 4000 + b"\r\n\r\n",
        "nonreading": _raw_post(_chat(model, max_tokens, True)),
    }
    abusers = [asyncio.create_task(_abuser(port, stop, pattern, payloads.get(pattern, b""))) for _ in range(count)]
    peak = 0

    async def sample() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, sample_tree(node_pid).rss_bytes)
            await asyncio.sleep(RSS_SAMPLE_S)

    sampler = asyncio.create_task(sample())
    await asyncio.sleep(min(5.0, duration_s / 4))  # let the abuse build up first
    latencies: list[float] = []
    errors: list[str] = []
    users = [asyncio.create_task(_legit(url, model, stop, latencies, errors)) for _ in range(LEGIT_USERS)]
    await asyncio.sleep(duration_s)
    stop.set()
    await asyncio.gather(*users, sampler, *abusers)
    latencies.sort()

    def pct(q: float) -> float:
        return latencies[min(len(latencies) - 1, int(q * len(latencies)))] * 1000 if latencies else float("nan")

    return PatternResult(pattern, len(latencies), len(errors), pct(0.5), pct(0.99), peak / 2**20, errors[:3])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--code-dir", default=str(Path(__file__).resolve().parent.parent))
    parser.add_argument("--duration-s", type=float, default=30.0)
    parser.add_argument("--idle", type=int, default=2000)
    parser.add_argument("--slowloris", type=int, default=200)
    parser.add_argument("--non-reading", type=int, default=10)
    parser.add_argument("--tpot-ms", type=float, default=1.0, help="the simulated worker's time per token")
    parser.add_argument("--family", default="llama3", help="model folder (deepseek: a 160k context)")
    parser.add_argument("--max-tokens", type=int, default=8000, help="of each non-reading client's stream")
    parser.add_argument("--patterns", default="baseline,idle,slowloris,nonreading")
    parser.add_argument("--node-flag", action="append", default=[], help="extra flag for serve (repeatable)")
    parser.add_argument("--node-nofile", type=int, default=0, help="the node's open-file limit (prlimit); 0 = ours")
    parser.add_argument("--failover", type=int, default=0, help="measure N requests' failover off a hung worker")
    parser.add_argument("--first-token-timeout-s", type=float, default=2.0, help="the node's, with --failover")
    args = parser.parse_args(argv)
    counts = {"baseline": 0, "idle": args.idle, "slowloris": args.slowloris, "nonreading": args.non_reading}
    work = Path(tempfile.mkdtemp(prefix="hardening-"))
    done = subprocess.run(
        [sys.executable, "-m", "node.cli", "models", "prepare", "--family", args.family, "--out", str(work / "models")],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    )
    model_dir = Path(done.stdout.strip().splitlines()[-1])
    code = Path(args.code_dir)
    py = [sys.executable, "-m", "node.cli"]
    sim_port, http_port = free_port(), free_port()
    sim = [*py, "sim-worker", "--port", str(sim_port), "--model-path", str(model_dir), "--tpot-ms", str(args.tpot_ms)]
    sim += ["--ttft-base-ms", "1", "--log-level", "warning"]
    node = [*py, "serve", "--port", str(http_port), "--model-path", str(model_dir), "--processes", "1"]
    node += ["--worker", f"grpc://127.0.0.1:{sim_port}", "--log-level", "warning", *args.node_flag]
    if args.node_nofile:
        node = ["prlimit", f"--nofile={args.node_nofile}:{args.node_nofile}", "--", *node]
    url = f"http://127.0.0.1:{http_port}"
    if args.failover:
        return _failover(args, code, sim, node, url, work)
    results: list[PatternResult] = []
    with contextlib.chdir(code), running("sim", sim, work / "sim.log") as sim_proc:
        wait_port(sim_proc, sim_port, 60)
        with running("node", node, work / "node.log") as node_proc:
            wait_port(node_proc, http_port, 60)
            model = _model(url)
            warm = _run_pattern("baseline", 0, url, http_port, model, args.max_tokens, 2.0, node_proc.pid)
            asyncio.run(warm)  # the first requests load caches: not billed to a pattern
            for pattern in args.patterns.split(","):
                run: Callable[[], Awaitable[PatternResult]] = lambda p=pattern: _run_pattern(  # noqa: E731
                    p, counts[p], url, http_port, model, args.max_tokens, args.duration_s, node_proc.pid
                )
                result = asyncio.run(run())
                results.append(result)
                print(
                    f"{result.pattern:11s} n={counts[pattern]:5d} ok={result.ok:5d} failed={result.failed:4d} "
                    f"success={result.success_rate:7.2%} p50={result.p50_ms:7.1f} ms p99={result.p99_ms:7.1f} ms "
                    f"peak RSS={result.peak_rss_mib:6.1f} MiB {result.errors}",
                    flush=True,
                )
                time.sleep(3.0)
            print(f"node log: {work / 'node.log'}")
    return 0


def _failover(args: argparse.Namespace, code: Path, sim: list[str], node: list[str], url: str, work: Path) -> int:
    hung_port = free_port()
    hung = [*sim, "--fault", "hang"]
    hung[hung.index("--port") + 1] = str(hung_port)
    sim_port = int(sim[sim.index("--port") + 1])
    node = [*node, "--worker", f"grpc://127.0.0.1:{hung_port}", "--policy", "round_robin"]
    node += ["--first-token-timeout-s", str(args.first_token_timeout_s)]
    with (
        contextlib.chdir(code),
        running("sim", sim, work / "sim.log") as sim_proc,
        running("hung", hung, work / "hung.log") as hung_proc,
    ):
        wait_port(sim_proc, sim_port, 60)
        wait_port(hung_proc, hung_port, 60)
        http_port = int(node[node.index("--port") + 1])
        with running("node", node, work / "node.log") as node_proc:
            wait_port(node_proc, http_port, 60)
            time.sleep(3.0)  # both workers pass a health check (the hung one does: only Generate hangs)
            times_s, failed = asyncio.run(_failover_requests(url, _model(url), args.failover))
    over = sorted(t for t in times_s if t >= args.first_token_timeout_s)
    direct = sorted(t for t in times_s if t < args.first_token_timeout_s)

    def p50(values: list[float]) -> str:
        return f"{values[len(values) // 2]:.2f} s" if values else "-"

    print(
        f"failover: {len(times_s)} ok, {failed} failed; {len(over)} failed over (first-token timeout "
        f"{args.first_token_timeout_s:g} s): p50 {p50(over)}, max {over[-1] if over else 0:.2f} s; "
        f"{len(direct)} served directly: p50 {p50(direct)}"
    )
    print(f"node log: {work / 'node.log'}")
    return 0


async def _failover_requests(url: str, model: str, count: int) -> tuple[list[float], int]:
    """Time to the last byte of ``count`` streamed chat requests in a row, and how many failed."""
    times_s: list[float] = []
    failed = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=LEGIT_TIMEOUT_S)) as session:
        for _ in range(count):
            started = time.monotonic()
            try:
                async with session.post(
                    url + "/v1/chat/completions", data=_chat(model, 16, True), headers=JSON
                ) as resp:
                    body = await resp.read()
                    if resp.status != 200 or b"[DONE]" not in body:
                        raise RuntimeError(f"{resp.status}: {body[:100]!r}")
            except (aiohttp.ClientError, TimeoutError, RuntimeError) as exc:
                failed += 1
                print(f"  failed: {exc}", flush=True)
                continue
            times_s.append(time.monotonic() - started)
            # A worker that timed out is out of rotation until its next health check passes (every 2 s):
            # spaced requests give it back, so more of them fail over.
            await asyncio.sleep(FAILOVER_GAP_S)
    return times_s, failed


def _model(url: str) -> str:
    import urllib.request

    with urllib.request.urlopen(url + "/v1/models", timeout=10) as resp:
        return str(json.loads(resp.read())["data"][0]["id"])


if __name__ == "__main__":
    raise SystemExit(main())
