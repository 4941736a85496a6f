"""The operators' status page: GET / and /status serve node/http/static/status.html (plain HTML and JS, no
build step), which polls GET /status.json and redraws; `smg-node status` prints the same JSON as tables.

The JSON is this node's view: its mesh's members, the cluster's workers (health verdict, this node's circuit,
load and in-flight), the models, this process's request totals (the page derives rates from two polls) and
the rate limiter's share and refusals.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Sequence
from importlib import resources
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web

from node.cluster.limiter import ClusterLimiter
from node.http.mesh_routes import member_json
from node.http.workers_api import worker_json
from node.metrics import NodeMetrics
from node.pipeline.served_model import ServedModel
from node.workers.pool import WorkerPool

if TYPE_CHECKING:
    from mesh import Mesh

#: How often the page polls /status.json (it is one small JSON document).
REFRESH_MS = 2000


def _page() -> bytes:
    return resources.files("node.http").joinpath("static/status.html").read_bytes()


def status_json(
    *,
    pool: WorkerPool,
    models: Sequence[ServedModel],
    metrics: NodeMetrics,
    mesh: Mesh | None,
    started_s: float,
    limiter: ClusterLimiter | None = None,
) -> dict[str, object]:
    now = asyncio.get_running_loop().time()
    tally = metrics.tally
    workers = []
    for w in sorted(pool.workers, key=lambda w: w.url):
        entry = worker_json(pool, w, now)
        tokens = tally.workers.get(w.url)
        entry["requests"] = tokens.requests if tokens is not None else 0
        entry["cache_hit_ratio"] = tokens.cache_hit_ratio if tokens is not None else None
        entry.pop("observations", None)  # per-node detail: GET /workers/{id}
        workers.append(entry)
    members = (
        sorted((member_json(m, now) for m in mesh.members()), key=lambda m: str(m["name"])) if mesh is not None else []
    )
    return {
        "node": {
            "name": mesh.name if mesh is not None else "",
            "pid": os.getpid(),
            "uptime_s": round(time.monotonic() - started_s, 1),
            "policy": pool.policy_name,
            "ready": pool.can_serve(),
        },
        "members": members,
        "workers": workers,
        "models": [{"id": m.name, "servable": pool.can_serve(m.name)} for m in models],
        "requests": {
            "total": tally.total,
            "by_class": dict(tally.by_class),
            "generated": tally.generated,
            "in_flight": tally.in_flight,
        },
        "rate_limits": _limits(limiter),
        "refresh_ms": REFRESH_MS,
        "generated_at": time.time(),
    }


def _limits(limiter: ClusterLimiter | None) -> dict[str, object] | None:
    """This node's share of each cluster-wide limit (1: it sees the whole cluster) and its refusals so far."""
    if limiter is None:
        return None
    share = limiter.share()
    return {"share": round(share, 3), "degraded": share < 1.0, "refused": dict(limiter.refused)}


def add_status_routes(
    app: web.Application,
    *,
    pool: WorkerPool,
    models: Sequence[ServedModel],
    metrics: NodeMetrics,
    mesh: Mesh | None,
    limiter: ClusterLimiter | None = None,
) -> None:
    started = time.monotonic()
    page = _page()

    async def html(request: web.Request) -> web.Response:
        return web.Response(body=page, content_type="text/html", charset="utf-8", headers={"Cache-Control": "no-cache"})

    async def as_json(request: web.Request) -> web.Response:
        body = status_json(pool=pool, models=models, metrics=metrics, mesh=mesh, started_s=started, limiter=limiter)
        return web.Response(
            body=msgspec.json.encode(body), content_type="application/json", headers={"Cache-Control": "no-store"}
        )

    app.router.add_get("/", html)
    app.router.add_get("/status", html)
    app.router.add_get("/status.json", as_json)
