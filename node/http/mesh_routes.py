"""GET /mesh/members and POST /mesh/join: the cluster as this node sees it, and joining another cluster."""

from __future__ import annotations

import asyncio
import time
from typing import TYPE_CHECKING

import msgspec
from aiohttp import web

from mesh import JoinError, Member, check_addr
from node.cluster.seeds import resolve_seeds
from node.errors import GatewayError, InvalidRequest
from node.http.errors import read_json

if TYPE_CHECKING:
    from mesh import Mesh

MAX_JOIN_PEERS = 16
MAX_JOIN_BODY_BYTES = 64 * 1024


class JoinRequest(msgspec.Struct, kw_only=True):
    peers: list[str]


class JoinFailed(GatewayError):
    status = 504
    error_type = "server_error"
    code = "join_failed"


def member_json(m: Member, now_s: float) -> dict[str, object]:
    return {
        "name": m.name,
        "mesh_addr": m.addr,
        "http_addr": m.http_addr,
        "state": m.state.name.lower(),
        "incarnation": m.incarnation,
        "since_change_s": round(max(0.0, now_s - m.state_change_s), 3),
        "version": m.version,
        "roles": m.roles,
    }


def add_mesh_routes(app: web.Application, mesh: Mesh) -> None:
    async def members(request: web.Request) -> web.Response:
        # Member times are on the loop's monotonic clock.
        now = asyncio.get_running_loop().time()
        body = {
            "self": mesh.name,
            "members": sorted((member_json(m, now) for m in mesh.members()), key=lambda m: str(m["name"])),
            "generated_at": time.time(),
        }
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")

    async def join(request: web.Request) -> web.Response:
        req = await read_json(request, JoinRequest, MAX_JOIN_BODY_BYTES)
        if not req.peers or len(req.peers) > MAX_JOIN_PEERS:
            raise InvalidRequest(f"'peers' must hold 1 to {MAX_JOIN_PEERS} addresses.", param="peers")
        for k, peer in enumerate(req.peers):
            try:
                check_addr(peer)
            except ValueError as exc:
                raise InvalidRequest(f"'peers[{k}]': {exc}", param=f"peers[{k}]") from exc
        peers = await resolve_seeds(req.peers, own=mesh.addr)  # names: every address they stand for, but us
        if not peers:
            raise JoinFailed(f"no peer of {list(req.peers)} resolves to another member's address")
        try:
            answered = await mesh.join(peers)
        except JoinError as exc:
            raise JoinFailed(str(exc)) from exc
        return web.Response(
            body=msgspec.json.encode({"joined": answered, "members": len(mesh.members())}),
            content_type="application/json",
        )

    app.router.add_get("/mesh/members", members)
    app.router.add_post("/mesh/join", join)
