"""The worker registry's admin API: POST /workers, GET /workers[/{id}], DELETE /workers/{id}.

Changes go to the cluster's registry, so a worker added on any node is routed to by every node (within
one gossip round) and outlives the node that added it. GET shows, per worker, the cluster's verdict, this
node's own view (routable here, load, requests in flight) and every live node's observation.
Errors use the OpenAI envelope, like every other endpoint.
"""

from __future__ import annotations

import asyncio

import msgspec
from aiohttp import web

from node.cluster.registry import WorkerRegistry, WorkerSpec
from node.errors import InvalidRequest, NotFound
from node.http.errors import read_json
from node.workers.pool import Worker, WorkerPool

MAX_WORKER_BODY_BYTES = 16 * 1024


class AddWorker(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    url: str
    model: str = ""
    role: str = "regular"
    labels: dict[str, str] = msgspec.field(default_factory=dict)


def _verdict(ok: bool | None) -> str:
    return "unknown" if ok is None else "healthy" if ok else "unhealthy"


def _load_json(worker: Worker, now_s: float) -> dict[str, object] | None:
    """The engine's last load report (null before the first), its age in seconds instead of a clock value."""
    load = worker.load
    if load is None:
        return None
    return {
        "running": load.running,
        "waiting": load.waiting,
        "waiting_uncached_tokens": load.waiting_uncached_tokens,
        "token_usage": load.token_usage,
        "gen_throughput": load.gen_throughput,
        "age_s": round(max(0.0, now_s - load.updated_at), 3),
    }


def worker_json(pool: WorkerPool, worker: Worker, now_s: float) -> dict[str, object]:
    board = pool.board
    observations = board.observations(worker.id) if board is not None else {}
    return {
        "id": worker.id,
        "url": worker.url,
        "model": worker.model or None,
        "role": worker.role,
        "labels": dict(worker.spec.labels),
        "verdict": _verdict(board.cluster_ok(worker.id) if board is not None else worker.healthy),
        "routable_here": pool.routable(worker),
        "circuit": worker.breaker.state,  # closed, open (left out of routing) or half_open (one trial)
        "in_flight": worker.in_flight,
        "load": _load_json(worker, now_s),
        "kv_events": worker.kv_events,
        "last_error": worker.last_error or None,
        "observations": {
            node: {
                "ok": obs.ok,
                "since": obs.since_s,
                "running": obs.running,
                "waiting": obs.waiting,
                "token_usage": obs.token_usage,
                "error": obs.error or None,
            }
            for node, obs in sorted(observations.items())
        },
    }


def _now() -> float:
    return asyncio.get_running_loop().time()  # the pool's clock (LoadView.updated_at)


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(body=msgspec.json.encode(body), status=status, content_type="application/json")


def add_worker_routes(app: web.Application, pool: WorkerPool, registry: WorkerRegistry) -> None:
    def find(request: web.Request) -> Worker:
        wid = request.match_info["worker_id"]
        worker = pool.get(wid)
        if worker is None:
            raise NotFound(f"No worker with id '{wid}'.", param="worker_id")
        return worker

    async def add(request: web.Request) -> web.Response:
        body = await read_json(request, AddWorker, MAX_WORKER_BODY_BYTES)
        try:
            spec = WorkerSpec(url=body.url, model=body.model, role=body.role, labels=body.labels)  # type: ignore[arg-type]
            pool.vet(spec, registered=len(registry.specs()))
            await pool.vet_addresses(spec)
        except ValueError as exc:
            field, _, rest = str(exc).partition(": ")
            param = field if field in ("url", "role", "model", "labels") else "url"
            raise InvalidRequest(rest if field == "url" else str(exc), param=param) from None
        existed = pool.get(spec.id) is not None
        registry.add(spec)  # the pool follows the registry synchronously
        worker = pool.get(spec.id)
        body_out = worker_json(pool, worker, _now()) if worker is not None else {"id": spec.id, **spec.to_json()}
        return _json(body_out, status=200 if existed else 201)

    async def list_workers(request: web.Request) -> web.Response:
        now = _now()
        workers = sorted((worker_json(pool, w, now) for w in pool.workers), key=lambda w: str(w["url"]))
        node = pool.board.node if pool.board is not None else None
        return _json({"object": "list", "node": node, "policy": pool.policy_name, "data": workers})

    async def get_worker(request: web.Request) -> web.Response:
        return _json(worker_json(pool, find(request), _now()))

    async def delete(request: web.Request) -> web.Response:
        worker = find(request)
        registry.remove(worker.id)
        return _json({"id": worker.id, "object": "worker", "deleted": True})

    app.router.add_post("/workers", add)
    app.router.add_get("/workers", list_workers)
    app.router.add_get("/workers/{worker_id}", get_worker)
    app.router.add_delete("/workers/{worker_id}", delete)
