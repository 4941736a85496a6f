"""The asyncio shell around the SWIM core: sockets, the timer, and the API the node uses.

    async with Mesh(config, meta=meta, delegate=state, events=listener) as mesh:
        await mesh.join(["10.0.0.1:7946", "10.0.0.2:7946"])
        mesh.members()          # immutable snapshots
        await mesh.leave()      # graceful: others see LEFT, not DEAD

Everything runs on the event loop thread; the core is called synchronously from socket callbacks, one
``loop.call_at`` timer and the tasks of outgoing streams, all owned here and cancelled at shutdown.
Shutdown order: stop the core (no more timers or sends), cancel stream tasks, close the sockets.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import random
from collections.abc import Collection, Sequence
from types import TracebackType
from typing import Self

from mesh.actions import SendPacket, StreamRequest
from mesh.addr import WILDCARD_HOSTS, join_addr
from mesh.config import MeshConfig
from mesh.delegate import Delegate, EventDelegate
from mesh.errors import JoinError, MeshStateError, TransportError
from mesh.keyring import Keyring
from mesh.member import Member, MemberState, NodeMeta, check_addr, check_member_addr
from mesh.metrics import MeshMetrics
from mesh.swim import Swim
from mesh.tls import TlsContexts
from mesh.transport import AsyncioTransport, Transport

log = logging.getLogger(__name__)


class Mesh:
    """One member of the mesh. Use as an async context manager, or call ``start``/``shutdown``."""

    def __init__(
        self,
        config: MeshConfig,
        *,
        meta: NodeMeta | None = None,
        delegate: Delegate | None = None,
        events: EventDelegate | None = None,
        keyring: Keyring | None = None,
        rng: random.Random | None = None,
    ) -> None:
        """``keyring`` overrides ``config.keyring_file``."""
        self.config = config
        self._meta = meta
        self._delegate = delegate
        self._events = events
        self._keyring = keyring
        self._rng = rng or random.Random()
        self._swim: Swim | None = None
        self._transport: Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._armed_at: float | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._join_waiters: dict[int, asyncio.Future[bool]] = {}
        self._left: asyncio.Event | None = None

    # -- lifecycle --

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.shutdown()

    async def start(self) -> None:
        """Bind the sockets and start probing. Raises TransportError, KeyringError, TlsError, MeshStateError, and
        ValueError when the address we would advertise is not a literal IP (members gossip addresses, never names)."""
        if self._swim is not None:
            raise MeshStateError("mesh already started")
        config = self.config
        keyring = self._keyring
        if keyring is None and config.keyring_file:
            keyring = Keyring.load(config.keyring_file)
        host = config.advertise_addr or config.bind_addr
        if host in WILDCARD_HOSTS:
            raise MeshStateError("advertise_addr is required when bind_addr is a wildcard address")
        check_member_addr(join_addr(host, config.advertise_port or 1))  # before binding: nothing to undo
        tls = None
        if config.tls_enabled:
            tls = TlsContexts.load(config.tls_cert_file, config.tls_key_file, config.tls_ca_file)
            if keyring is None:
                log.warning("mesh: TLS protects TCP streams only; UDP gossip stays unencrypted without a keyring")
        loop = asyncio.get_running_loop()
        transport = await AsyncioTransport.bind(
            config.bind_addr,
            config.bind_port,
            on_packet=self._on_packet,
            on_stream=self._on_stream,
            admit_stream=self._admit_stream,
            stream_timeout_s=config.tcp_timeout_s,
            tls=tls,
        )
        addr = join_addr(host, config.advertise_port or transport.port)
        self._transport = transport
        self._swim = Swim(
            config,
            addr=addr,
            now=loop.time(),
            rng=self._rng,
            meta=self._meta,
            keyring=keyring,
            delegate=self._delegate,
            events=self._events,
        )
        self._pump()

    async def shutdown(self) -> None:
        """Stop without a leave message (others will detect us as failed). Idempotent."""
        swim, transport = self._swim, self._transport
        if swim is None or transport is None:
            return
        swim.stop()
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for waiter in self._join_waiters.values():
            waiter.cancel()
        self._join_waiters.clear()
        await transport.close()
        self._transport = None

    # -- API --

    @property
    def name(self) -> str:
        return self._core.name

    @property
    def addr(self) -> str:
        """Our advertised "host:port" (with the real port when bind_port was 0)."""
        return self._core.addr

    @property
    def keyring(self) -> Keyring | None:
        """The live keyring (rotate with add/use/remove), or None without encryption."""
        return self._core.keyring

    def members(self) -> tuple[Member, ...]:
        return self._core.members()

    def member_names(self, states: Collection[MemberState]) -> list[str]:
        """Names of the members in ``states`` (cheaper than ``members()``: no snapshots)."""
        return self._core.member_names(states)

    @property
    def size(self) -> int:
        """``len(members())``, without building them."""
        return self._core.size

    def metrics(self) -> MeshMetrics:
        metrics = self._core.metrics()
        assert self._transport is not None  # _core checked it
        transport = self._transport
        return dataclasses.replace(
            metrics,
            tls_handshake_failures=transport.tls_handshake_failures,
            streams_refused=transport.streams_refused,
        )

    def update_meta(self, meta: NodeMeta) -> None:
        self._core.update_meta(self._now(), meta)
        self._pump()

    async def join(self, seeds: Sequence[str]) -> int:
        """Push-pull with every seed, retrying with backoff until at least one answers.

        Returns how many seeds answered. Raises JoinError after ``join_timeout_s``, ValueError for a
        malformed address, MeshStateError if not started or after leave.
        """
        if not seeds:
            raise ValueError("join: no seed addresses")
        for seed in seeds:
            check_addr(seed)
        core = self._core
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.join_timeout_s
        backoff = self.config.join_backoff_initial_s
        attempt = 0
        while True:
            attempt += 1
            waiters = []
            for token in core.join(self._now(), list(seeds)):
                waiter: asyncio.Future[bool] = loop.create_future()
                self._join_waiters[token] = waiter
                waiters.append(waiter)
            self._pump()
            answered = sum(await asyncio.gather(*waiters))
            if answered:
                return answered
            pause = min(backoff, self.config.join_backoff_max_s) * (0.5 + self._rng.random() / 2)
            if loop.time() + pause > deadline:
                raise JoinError(f"no seed of {list(seeds)} answered after {attempt} attempts")
            log.info("join attempt %d failed; retrying in %.2fs", attempt, pause)
            await asyncio.sleep(pause)
            backoff *= 2

    async def leave(self) -> None:
        """Announce a graceful departure and wait (up to ``leave_timeout_s``) until it was gossiped.
        Call ``shutdown`` (or leave the context) afterwards."""
        core = self._core
        self._left = asyncio.Event()
        core.leave(self._now())
        self._pump()
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self.config.leave_timeout_s):
                await self._left.wait()

    # -- plumbing --

    @property
    def _core(self) -> Swim:
        if self._swim is None or self._transport is None:
            raise MeshStateError("mesh is not running")
        return self._swim

    def _now(self) -> float:
        return asyncio.get_running_loop().time()

    def _on_packet(self, data: bytes, addr: str) -> None:
        if self._swim is None:
            return
        try:
            self._swim.handle_packet(self._now(), data, addr)
        except Exception:  # a bug must not take the node down; the core handles bad input itself
            log.exception("mesh: packet handling failed")
        self._pump()

    def _on_stream(self, frame: bytes, addr: str) -> bytes | None:
        if self._swim is None:
            return None
        try:
            reply = self._swim.handle_stream(self._now(), frame, addr)
        except Exception:
            log.exception("mesh: stream handling failed")
            reply = None
        self._pump()
        return reply

    def _admit_stream(self, prefix: bytes, addr: str) -> bool:
        if self._swim is None:
            return False
        try:
            return self._swim.admit_stream(self._now(), prefix, addr)
        except Exception:
            log.exception("mesh: stream admission failed")
            return False

    def _on_timer(self) -> None:
        self._timer = None
        if self._swim is None:
            return
        # call_at may run a hair before the deadline (clock resolution); never hand the core an earlier time.
        now = max(self._now(), self._armed_at or 0.0)
        self._armed_at = None
        try:
            self._swim.handle_timer(now)
        except Exception:
            log.exception("mesh: timer handling failed")
        self._pump()

    def _pump(self) -> None:
        """Carry out the core's actions, then (re)arm the one timer."""
        swim, transport = self._swim, self._transport
        if swim is None or transport is None:
            return
        if self._left is not None and swim.leave_complete:
            self._left.set()
        for action in swim.drain_actions():
            if isinstance(action, SendPacket):
                transport.send_packet(action.addr, action.data)
            else:
                task = asyncio.get_running_loop().create_task(self._stream(action))
                self._tasks.add(task)
                task.add_done_callback(self._tasks.discard)
        deadline = swim.next_deadline()
        if deadline == self._armed_at and self._timer is not None:
            return
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._armed_at = deadline
        if deadline is not None:
            self._timer = asyncio.get_running_loop().call_at(deadline, self._on_timer)

    async def _stream(self, req: StreamRequest) -> None:
        transport, swim = self._transport, self._swim
        if transport is None or swim is None:
            return
        reply: bytes | None
        try:
            reply = await transport.request(req.addr, req.data, req.deadline - self._now())
        except TransportError as exc:
            log.debug("mesh: %s", exc)
            reply = None
        ok = swim.handle_stream_reply(self._now(), req.token, reply)
        waiter = self._join_waiters.pop(req.token, None)
        if waiter is not None and not waiter.done():
            waiter.set_result(ok)
        self._pump()
