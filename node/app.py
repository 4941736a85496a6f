"""The composition root: builds storage -> mesh -> cluster state -> workers -> model -> HTTP on one AsyncExitStack
and unwinds in reverse.

Shutdown order (reverse of construction), the drain of node/drain.py first: readiness 503, start leaving the
mesh and stop accepting HTTP, let in-flight requests and streams finish (bounded by ``drain_timeout_s``), then
cancel and await background tasks (health checks, Aborts), then close worker channels and the CPU pool, await
the mesh leave, and last close the history stores (so in-flight responses can still be stored).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from aiohttp import web
from aiohttp.typedefs import Middleware

from node.auth.authenticator import ApiKeyAuthenticator
from node.auth.client_cert import CertIdentities
from node.auth.config import read_bootstrap_key
from node.cluster.key_store import DurableKeys
from node.cluster.member import leave_mesh, publish_http_addr, run_mesh
from node.cluster.registry import WorkerRegistry
from node.cluster.state import HINT_MAX_MESSAGE_BYTES, SharedState, mesh_delegate, open_shared_state, run_ticker
from node.config import HttpConfig, ModelConfig, NodeConfig
from node.discovery.dns import DnsClient, DnsDiscovery, system_nameserver
from node.drain import Drain
from node.http.auth_middleware import auth_middleware
from node.http.connection_rate import ConnectionRate
from node.http.connections import ConnectionGate, ConnectionLimits, default_max_connections, fd_room, listen
from node.http.keys_api import add_key_routes
from node.http.limits_api import add_limit_routes
from node.http.limits_middleware import add_rate_headers, limits_middleware
from node.http.mesh_routes import add_mesh_routes
from node.http.middleware import errors, request_identity
from node.http.protocol import EnvelopeAppRunner
from node.http.server import build_app
from node.http.status import add_status_routes
from node.http.tls import ServerTls, TlsFiles
from node.http.workers_api import add_worker_routes
from node.loop_monitor import LoopLagMonitor
from node.metrics import NodeMetrics
from node.pipeline.cpu import CpuPool
from node.pipeline.served_model import ServedModel, load_served_model
from node.progress import reporting
from node.routing.affinity import AffinityHints
from node.routing.kv_indexes import KvIndexes
from node.routing.policy import RoutingPolicy
from node.routing.registry import make_policy
from node.tasks import Supervisor
from node.telemetry.observe import observe
from node.telemetry.tracing import Tracing
from node.workers.breaker import CircuitBreaker
from node.workers.channel_config import ChannelConfig
from node.workers.client import WorkerClient
from node.workers.pool import Worker, WorkerPool
from node.workers.vllm_grpc import VllmGrpcClient
from node.workers.worker_url import parse_networks
from storage.base import Stores
from storage.errors import StorageError
from storage.factory import open_stores
from storage.keys import FileKeyStore, KeyStore

if TYPE_CHECKING:
    from opentelemetry.sdk.trace.export import SpanExporter

    from mesh import Mesh
    from node.models.parses import TokenizerParses

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class RunningNode:
    url: str
    port: int
    model: ServedModel
    pool: WorkerPool
    shared: SharedState
    mesh: Mesh | None = None
    #: HTTPS: the live context and its reload (SIGHUP), or None for plain HTTP.
    tls: ServerTls | None = None
    #: The admin API's own listener (--admin-bind), or None when the main port serves it.
    admin_url: str | None = None
    #: The admin listener's HTTPS: ``tls`` itself (the same files), its own (--admin-tls-cert-file), or None.
    admin_tls: ServerTls | None = None


#: Connections the kernel queues before we accept them (a burst of clients connecting at once).
LISTEN_BACKLOG = 1024


def _connection_limits(http: HttpConfig) -> ConnectionLimits:
    cap = http.max_connections or default_max_connections()
    room = fd_room()
    if room is not None and cap > room:
        log.warning("--max-connections %d is more than the open-file limit leaves room for (%d)", cap, room)
    log.info("accepting at most %d client connections", cap)
    return ConnectionLimits(
        max_connections=cap,
        idle_timeout_s=http.idle_timeout_s,
        header_timeout_s=http.header_timeout_s,
        body_timeout_s=http.body_timeout_s,
        write_timeout_s=http.write_timeout_s,
    )


def _connection_rate(http: HttpConfig) -> ConnectionRate | None:
    if not http.connection_rate_per_s:
        return None
    exempt = parse_networks(http.connection_rate_exempt, "connection_rate_exempt")
    return ConnectionRate(http.connection_rate_per_s, http.connection_rate_burst, exempt)


@contextlib.asynccontextmanager
async def run_node(
    config: NodeConfig,
    *,
    client_factory: Callable[[str], WorkerClient] | None = None,
    span_exporter: SpanExporter | None = None,
    tokenizer_parses: TokenizerParses | None = None,
) -> AsyncIterator[RunningNode]:
    """Start a node and yield it while it serves. Raises ModelFolderError/TemplateError on a bad model,
    WorkerTlsError on unusable worker TLS files, AuthConfigError on an unreadable bootstrap key file.
    ``span_exporter`` replaces the OTLP exporter of traced requests (tests); ``tokenizer_parses`` shares
    tokenizer.json parses with other loaders in the process (the demo's simulated workers)."""
    # Read before anything starts: a bad key file stops the node with the file named.
    bootstrap_key = read_bootstrap_key(config.auth)
    http = config.http
    tls = (
        ServerTls(TlsFiles(http.tls_cert_file, http.tls_key_file, http.tls_client_ca_file))
        if http.tls_cert_file
        else None
    )
    auth = config.auth
    admin_tls = (
        ServerTls(TlsFiles(auth.admin_tls_cert_file, auth.admin_tls_key_file, auth.admin_tls_client_ca_file))
        if auth.admin_tls_cert_file
        else tls
    )
    async with contextlib.AsyncExitStack() as stack:
        stores = await stack.enter_async_context(open_stores(config.storage))
        supervisor = Supervisor()
        mesh, channels = None, None
        if config.cluster.enabled:
            channels = mesh_delegate()
            bind_http = f"{config.http.host}:{config.http.port}"
            mesh = await stack.enter_async_context(run_mesh(config.cluster, http_addr=bind_http, delegate=channels))
        drain = Drain()
        stack.push_async_callback(drain.left)  # unwound just before run_mesh stops the member
        routing = config.routing
        roles = ("regular", "prefill", "decode")
        by_model = routing.policies_by_model()
        cache_aware = "cache_aware" in {*(routing.policy_for(role) for role in roles), *by_model.values()}
        kv_indexes = KvIndexes(routing.kv_index_max_blocks) if cache_aware else None
        hints = None
        if mesh is not None and cache_aware:
            hints = AffinityHints(
                routing.page_size_tokens,
                ttl_s=routing.affinity_hint_ttl_s,
                max_entries=routing.affinity_hint_max_entries,
                max_message_bytes=HINT_MAX_MESSAGE_BYTES,
            )
        shared = open_shared_state(
            mesh=mesh,
            channels=channels,
            health_publish_interval_s=config.workers.health_publish_interval_s,
            on_hints=hints.receive if hints is not None else lambda _msg: None,
        )
        keys = DurableKeys(shared.keys, _key_store(config, stores))
        stack.callback(keys.close)
        stack.push_async_callback(keys.flush_at_exit)  # unwound after the supervisor, before the stores close
        if keys.durable:  # before serving: after a full-cluster restart the keys come from here
            try:
                await keys.load()
            except StorageError as exc:
                log.warning("key store: cannot load the API keys at start (%s); retrying in the background", exc)
        models: list[ServedModel] = []  # filled once loaded, before HTTP serves

        def policy_for(role: str, model: str | None) -> RoutingPolicy:
            # Made on a pool's first request, so after the models are loaded: --model-policy may name an alias.
            name = routing.policy_for(role)
            if role == "regular" and model is not None:
                served = next((m for m in models if m.name == model), None)
                name = next((p for n, p in by_model.items() if served is not None and served.answers_to(n)), name)
            kv_index = kv_indexes.of(model) if kv_indexes is not None else None
            return make_policy(name, routing, kv_index=kv_index, hints=hints)

        lag_monitor = LoopLagMonitor()
        pool = WorkerPool(
            config.workers,
            client_factory=client_factory
            or functools.partial(
                VllmGrpcClient,
                generate_transport=config.workers.generate_transport,
                channel=ChannelConfig.from_pool(config.workers),
                policy=config.workers.network_policy,
            ),
            policies=policy_for,
            policy_name=routing.policy,
            breakers=functools.partial(
                CircuitBreaker,
                failures_to_open=routing.circuit_failures_to_open,
                open_s=routing.circuit_open_s,
                clock=asyncio.get_running_loop().time,
            ),
            supervisor=supervisor,
            kv_indexes=kv_indexes,
            board=shared.board,
            model_of=lambda worker: _model_of(models, worker),
            loop_lag=lag_monitor.recent_lag_s,
        )
        stack.push_async_callback(pool.close)
        cpu = CpuPool(threads=max(2, os.cpu_count() or 2))
        stack.callback(cpu.close)
        await stack.enter_async_context(supervisor)
        # The --worker flags register workers in the cluster (a no-op where they are registered already);
        # from then on the pool follows the registry, whichever node changes it.
        for spec in pool.workers:
            shared.registry.add(spec.spec)
        pool.sync(shared.registry.specs())
        stack.callback(shared.registry.subscribe(lambda: pool.sync(shared.registry.specs())))
        if config.discovery.worker_dns:  # the first answer before start: its workers may name the model
            discovery = _dns_discovery(config, shared.registry)
            await discovery.sync_once()
            supervisor.spawn(discovery.run(), name="worker-dns")
        if config.discovery.worker_k8s_selector:
            from node.discovery.kubernetes import K8sDiscovery, k8s_target

            k8s = K8sDiscovery(k8s_target(config.discovery), shared.registry, max_workers=config.workers.max_workers)
            supervisor.spawn(k8s.run(), name="worker-k8s")
        pool.start()
        supervisor.spawn(lag_monitor.run(), name="loop-lag")  # the health checks read it from the start
        supervisor.spawn(run_ticker(shared, hints), name="cluster-state")
        supervisor.spawn(keys.run(), name="key-store")
        if not pool.workers:
            log.warning("no workers yet: add some with POST /workers (or --worker), or join a cluster that has them")

        models.extend(await _load_models(config, pool, tokenizer_parses))
        for served in models:  # the loop encodes short prompts inline (node.pipeline.cpu), the pool the others
            served.tokenizer.warm_this_thread()
            await cpu.warm(served.tokenizer.warm_this_thread)
        model = models[0]
        for name in by_model:
            if not any(m.answers_to(name) for m in models):
                log.warning("--model-policy names %r, which is not a served model: ignored", name)
        telemetry = config.telemetry
        metrics = NodeMetrics(
            pool,
            multiproc_dir=telemetry.metrics_dir,
            process_index=config.cluster.process_index,
            max_tenants=telemetry.metrics_max_tenants,
        )
        if telemetry.metrics_dir:
            supervisor.spawn(metrics.run_snapshots(), name="metrics-snapshots")
        tracing = None
        if telemetry.tracing:
            tracing = Tracing(telemetry, exporter=span_exporter)
            stack.callback(tracing.close)
        metrics.watch_tokenizer(model.tokenizer)
        metrics.watch_state(shared)
        if mesh is not None:
            metrics.watch_mesh(mesh)
        path = model.tokenizer.encode_path
        log.info(
            "tokenizer: %s encoder%s; prefix cache %s",
            path.encoder,
            f" ({path.encoder_reason})" if path.encoder_reason else "",
            "on" if path.prefix_cache else f"off ({path.prefix_cache_reason})",
        )
        if model.template is not None:  # minijinja where it renders as jinja2 does (node/pipeline/template_fast.py)
            log.info("chat template: %s", model.template.engine)
        lag_monitor.export(metrics.registry)
        middlewares: list[Middleware] = []
        if config.auth.enforced(config.http.host):
            if not keys.durable:
                log.warning(
                    "API keys made with /admin/keys are kept in the cluster's memory only: if every node stops "
                    "they are gone; keep them with --history-backend redis or postgres, or --keys-file FILE"
                )
            authenticator = ApiKeyAuthenticator(shared.keys.get, bootstrap_key=bootstrap_key, clock=time.time)
            failures = metrics.auth_failures
            jwt = None
            if config.auth.jwt_enabled:
                from node.auth.jwt_auth import JwtAuthenticator  # PyJWT and cryptography: only for JWTs

                jwt = JwtAuthenticator.from_config(config.auth)
            middlewares.append(
                auth_middleware(
                    authenticator,
                    jwt=jwt,
                    certs=CertIdentities(config.auth.client_cert_rules),
                    on_failure=lambda f: failures.labels(f.reason).inc(),
                )
            )
            middlewares.append(limits_middleware(shared.limiter, shared.tenant_limits))
        else:
            log.warning("authentication is off: anyone who reaches %s may call every route", config.http.host)
        gate = ConnectionGate(
            _connection_limits(config.http), clock=asyncio.get_running_loop().time, rate=_connection_rate(config.http)
        )
        metrics.watch_connections(gate)
        app = build_app(
            # Outermost: the connection gate marks when a connection starts a request.
            outer_middlewares=[gate.middleware()],
            models=models,
            pool=pool,
            cpu=cpu,
            metrics=metrics,
            max_body_bytes=config.http.max_body_bytes,
            routing_key_header=routing.routing_key_header,
            stores=stores,
            tenancy=config.api,
            retry=config.retry,
            deadlines=config.deadlines,
            limits=config.limits,
            observe=observe(metrics, tracing_=tracing, access_log_on=telemetry.access_log, identity=request_identity),
            drain=drain,
            inner_middlewares=middlewares,
        )
        # The admin API on the main port, or on its own listener (--admin-bind), behind the same auth.
        admin = app if config.auth.admin_addr is None else web.Application(middlewares=[errors({}), *middlewares])
        if mesh is not None:
            add_mesh_routes(admin, mesh)
        add_worker_routes(admin, pool, shared.registry)
        add_key_routes(admin, keys)
        add_limit_routes(admin, shared.tenant_limits)
        app.on_response_prepare.append(add_rate_headers)
        add_status_routes(admin, pool=pool, models=models, metrics=metrics, mesh=mesh, limiter=shared.limiter)
        admin_url = None
        if admin is not app:
            # The status page's /metrics link is relative: the admin listener serves it too (same roles).
            admin.router.add_get("/metrics", metrics.handle)
            admin_url = await _serve_admin(
                stack, admin, config.auth.admin_addr, admin_tls, reuse_port=config.http.reuse_port
            )
        runner = EnvelopeAppRunner(
            app, handler_cancellation=True, access_log=None, shutdown_timeout=config.http.drain_timeout_s
        )
        await runner.setup()
        stack.push_async_callback(runner.cleanup)
        listener = await listen(
            runner,
            gate,
            host=config.http.host,
            port=config.http.port,
            backlog=LISTEN_BACKLOG,
            reuse_port=config.http.reuse_port,
            ssl_context=tls.context if tls is not None else None,
        )
        stack.callback(listener.close)  # stop accepting first; runner.cleanup then drains the open connections
        port = int(listener.sockets[0].getsockname()[1])  # with port 0 the OS picked it
        host = config.http.host if ":" not in config.http.host else f"[{config.http.host}]"
        scheme = "https" if tls is not None else "http"
        node = RunningNode(
            url=f"{scheme}://{host}:{port}",
            port=port,
            model=model,
            pool=pool,
            shared=shared,
            mesh=mesh,
            tls=tls,
            admin_url=admin_url,
            admin_tls=admin_tls if admin_url is not None else None,
        )
        if mesh is not None:
            publish_http_addr(mesh, config.cluster, f"{host}:{port}")
        # Unwound first: readiness 503 and the mesh leave start before the listener closes.
        stack.callback(_start_drain, drain, mesh, config.http.drain_timeout_s)
        log.info(
            "serving %s on %s with %d worker(s)", ", ".join(repr(m.name) for m in models), node.url, len(pool.workers)
        )
        yield node


def _key_store(config: NodeConfig, stores: Stores) -> KeyStore | None:
    """Where the API keys are kept durably: the shared history backend, else the node's --keys-file."""
    if stores.keys is not None:
        return stores.keys
    return FileKeyStore(config.auth.keys_file) if config.auth.keys_file else None


def _start_drain(drain: Drain, mesh: Mesh | None, timeout_s: float) -> None:
    drain.start(leave=functools.partial(leave_mesh, mesh) if mesh is not None else None)
    log.info("closing the HTTP listener; in-flight requests have %.0f s to finish", timeout_s)


async def _serve_admin(
    stack: contextlib.AsyncExitStack,
    admin: web.Application,
    addr: tuple[str, int] | None,
    tls: ServerTls | None,
    *,
    reuse_port: bool,
) -> str:
    """Serve the admin application on ``addr`` until the stack unwinds; returns its URL. HTTPS with ``tls``
    (its live context: a reload reaches new handshakes), else plain HTTP (an operator network).

    ``reuse_port``: the sibling processes of ``--processes N`` bind the same admin port, as they do the main
    one, and the kernel spreads admin connections over them. Every process can answer every admin call (the
    workers, keys and limits are cluster state, shared through their mesh), so no process is special and the
    admin API stays up while the supervisor replaces a dead one."""
    assert addr is not None
    runner = web.AppRunner(admin, access_log=None)
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    site = web.TCPSite(
        runner, addr[0], addr[1], ssl_context=tls.context if tls is not None else None, reuse_port=reuse_port or None
    )
    await site.start()
    port = int(runner.addresses[0][1])
    host = addr[0] if ":" not in addr[0] else f"[{addr[0]}]"
    url = f"{'https' if tls is not None else 'http'}://{host}:{port}"
    log.info("admin API on %s", url)
    return url


async def _load_models(
    config: NodeConfig, pool: WorkerPool, parses: TokenizerParses | None = None
) -> list[ServedModel]:
    """Load every model folder (tokenizers in parallel threads). One model takes its name and context length
    from the workers' GetModelInfo, as before; several are named by their folders (or the workers' names
    matching them) and each served by the workers that name it. Raises ValueError on a name clash."""
    loop = asyncio.get_running_loop()
    paths = config.model.model_path
    # The names a MODEL=NAME parser override may use: the served name given, the folder's name or path.
    known = [
        frozenset({path, Path(path).name} | ({served} if served else set()))
        for k, path in enumerate(paths)
        for served in [config.model.served_model_name if k == 0 else ""]
    ]
    _check_parser_overrides(config.model, known)
    loading = [
        loop.run_in_executor(
            None,
            functools.partial(
                load_served_model,
                path,
                served_name=config.model.served_model_name if k == 0 else "",
                chat_template_file=config.model.chat_template if k == 0 else "",
                tokenizer_cache=config.tokenizer_cache,
                tool_call_parser=config.model.parsers_for(known[k])[0],
                reasoning_parser=config.model.parsers_for(known[k])[1],
                tokenizer_parses=parses,
            ),
        )
        for k, path in enumerate(paths)
    ]
    info = None
    if len(paths) == 1 and not config.model.served_model_name and pool.workers:
        wait_s = config.workers.startup_wait_s
        urls = ", ".join(w.url for w in pool.workers)
        async with reporting(
            lambda t: f"waiting for a worker to answer GetModelInfo ({t:.0f} of {wait_s:.0f} s): {urls}"
        ):
            info = await pool.wait_model_info(wait_s)
        if info is None:
            log.warning("no worker answered GetModelInfo; serving the model under its folder name")
    models = list(await asyncio.gather(*loading))
    if info is not None and info.served_model_name and info.served_model_name != models[0].name:
        models[0] = _renamed(models[0], info.served_model_name)
    if info is not None and 0 < info.max_context_length < models[0].max_context_length:
        models[0] = _with_context(models[0], info.max_context_length)
    names = [m.name for m in models]
    if len(set(names)) != len(names):
        raise ValueError(f"two model folders serve the same name: {', '.join(names)}")
    return models


def _dns_discovery(config: NodeConfig, registry: WorkerRegistry) -> DnsDiscovery:
    """Raises OSError/ValueError when no DNS server is configured and resolv.conf names none."""
    d = config.discovery
    client = DnsClient(d.server() or system_nameserver(), timeout_s=d.worker_dns_timeout_s)
    return DnsDiscovery(
        d.targets(), registry, client, interval_s=d.worker_dns_interval_s, max_workers=config.workers.max_workers
    )


def _check_parser_overrides(config: ModelConfig, known: list[frozenset[str]]) -> None:
    """Raises ValueError for a MODEL=NAME parser override naming no served model (a typo would otherwise
    silently leave that model on the fleet-wide parser)."""
    for values in (config.model_tool_call_parser, config.model_reasoning_parser):
        for value in values:
            model = value.rpartition("=")[0]
            if not any(model in names for names in known):
                raise ValueError(f"parser override {value!r}: no --model-path is known as {model!r}")


def _model_of(models: list[ServedModel], worker: Worker) -> str | None:
    """The served model ``worker`` belongs to: the only one, else the one its registered model, reported
    name or reported path names."""
    if len(models) <= 1:
        return models[0].name if models else None
    names = [worker.spec.model] if worker.spec.model else []
    if worker.info is not None:
        path = worker.info.model_path.rstrip("/")
        names += [worker.info.served_model_name, path, path.rsplit("/", 1)[-1]]
    for model in models:
        if any(name and model.answers_to(name) for name in names):
            return model.name
    return None


def _renamed(model: ServedModel, name: str) -> ServedModel:
    return replace(model, name=name, aliases=(model.aliases | {model.name}) - {name})


def _with_context(model: ServedModel, length: int) -> ServedModel:
    return replace(model, max_context_length=length)
