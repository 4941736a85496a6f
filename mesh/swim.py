"""The sans-IO SWIM + Lifeguard core: bytes and time in, actions out.

Drive it with ``handle_packet``, ``handle_stream``, ``handle_stream_reply`` and ``handle_timer``, each
given the current time; after each call, perform ``drain_actions()`` and wake it again at
``next_deadline()``. It never blocks, sleeps, reads a clock or touches a socket, so the same object runs
under the asyncio shell (:mod:`mesh.runtime`) and the simulated network (:mod:`mesh.sim`).

Failure detection, one probe per (awareness-scaled) probe interval:
  ping target (carrying a suspect about it if it is already suspect: Lifeguard's buddy system)
  -> no ack within the probe timeout: ping-req through ``indirect_checks`` random members, which nack if the
     target stays silent, and ask the shell for a TCP ping (fallback)
  -> still nothing by the end of the interval: suspect the target; missing nacks raise our awareness score.
Dissemination: every packet carries as many queued broadcasts as fit; gossip rounds send the queue to
``gossip_nodes`` random members; push-pull exchanges full state over TCP periodically and on join.
"""

from __future__ import annotations

import logging
import math
import random
from collections.abc import Collection
from dataclasses import dataclass, field

from mesh.actions import Action
from mesh.awareness import Awareness
from mesh.broadcast import BroadcastQueue
from mesh.codec import check_frame_prefix, encode_message, open_frame, open_packet, seal_frame
from mesh.config import MeshConfig
from mesh.delegate import Delegate, EventDelegate
from mesh.errors import DecodeError, DecryptError, MeshStateError
from mesh.keyring import Keyring
from mesh.limits import (
    MAX_PENDING_ACKS,
    MAX_U32,
    MAX_USER_STATE_BYTES,
    PUSH_PULL_SCALE_THRESHOLD,
)
from mesh.member import Member, MemberState, NodeMeta, check_member_addr, check_name
from mesh.membership import Membership, NodeState
from mesh.messages import (
    Ack,
    Alive,
    Dead,
    IndirectPing,
    Message,
    Nack,
    Ping,
    PushPull,
    Suspect,
    User,
)
from mesh.metrics import Counters, MeshMetrics
from mesh.outbox import Outbox
from mesh.ratelog import RefusalLog
from mesh.timers import Timer, Timers

#: A relay nacks after this fraction of the requester's indirect-probe window (probe interval minus probe
#: timeout, at most one probe timeout). memberlist waits a full probe timeout, which with its LAN values
#: (500 ms of a 1 s interval) lands the nack just *after* the requester's deadline, so the requester always
#: counts it missing and its health score climbs on every real failure. 20% leaves room for the round trip.
_NACK_FRACTION = 0.8

log = logging.getLogger(__name__)


def push_pull_scale(interval_s: float, n: int) -> float:
    """Stretch the push-pull interval in big clusters so full-state traffic per node stays bounded."""
    if n <= PUSH_PULL_SCALE_THRESHOLD:
        return interval_s
    return (math.ceil(math.log2(n) - math.log2(PUSH_PULL_SCALE_THRESHOLD)) + 1) * interval_s


@dataclass(slots=True, eq=False)
class _Probe:
    seq: int
    target: str
    target_addr: str
    deadline: float
    acked: bool = False
    fallback_ok: bool = False
    nacks: int = 0
    expected_nacks: int = 0
    timer: Timer | None = None


@dataclass(slots=True, eq=False)
class _Relay:
    """An indirect probe we run for ``source_addr``: forward the ack, or nack on timeout."""

    source_addr: str
    source_seq: int
    timer: Timer | None = field(default=None)


@dataclass(frozen=True, slots=True)
class _FallbackPing:
    seq: int


@dataclass(frozen=True, slots=True)
class _PushPullCall:
    join: bool
    addr: str


class Swim:
    """One member's protocol state. Not thread-safe: one owner drives it."""

    def __init__(
        self,
        config: MeshConfig,
        *,
        addr: str,
        now: float,
        rng: random.Random,
        meta: NodeMeta | None = None,
        keyring: Keyring | None = None,
        delegate: Delegate | None = None,
        events: EventDelegate | None = None,
    ) -> None:
        """``addr`` is our advertised "ip:port". Raises ValueError on a bad name or address."""
        check_member_addr(addr)
        name = config.node_name or addr
        check_name(name)
        self.config = config
        self.name = name
        self.addr = addr
        self._rng = rng
        self._keyring = keyring
        self._delegate = delegate
        self._counters = Counters()
        self._timers = Timers()
        self._awareness = Awareness(config.awareness_max_multiplier)
        self._broadcasts = BroadcastQueue(config.retransmit_mult)
        self._seq = 0
        self._token = 0
        self._acks: dict[int, _Probe | _Relay] = {}
        self._probe: _Probe | None = None
        self._streams: dict[int, _FallbackPing | _PushPullCall] = {}
        self._stopped = False
        self._refusals = RefusalLog(log)
        window = min(config.probe_timeout_s, config.probe_interval_s - config.probe_timeout_s)
        self._nack_after_s = _NACK_FRACTION * window
        local = NodeState(name, addr, meta or NodeMeta(), 0, MemberState.ALIVE, now)
        self._out = Outbox(
            keyring=keyring,
            broadcasts=self._broadcasts,
            delegate=delegate,
            counters=self._counters,
            cluster_size=self._cluster_size,
        )
        self._members = Membership(
            config=config,
            local=local,
            rng=rng,
            broadcasts=self._broadcasts,
            awareness=self._awareness,
            timers=self._timers,
            counters=self._counters,
            events=events,
        )
        self._members.bootstrap(now)
        # Random stagger so that members started together do not probe and gossip in lockstep.
        self._timers.call_at(now + rng.uniform(0, config.probe_interval_s), self._probe_tick)
        self._timers.call_at(now + rng.uniform(0, config.gossip_interval_s), self._gossip_tick)
        if config.push_pull_interval_s > 0:
            self._timers.call_at(now + rng.uniform(0, config.push_pull_interval_s), self._push_pull_tick)
        if config.reconnect_interval_s > 0:
            self._timers.call_at(now + rng.uniform(0, config.reconnect_interval_s), self._reconnect_tick)

    # -- the shell's side ------------------------------------------------------------------------------

    def next_deadline(self) -> float | None:
        """When to call ``handle_timer`` next (None: nothing scheduled)."""
        return self._timers.next_deadline()

    def handle_timer(self, now: float) -> None:
        self._timers.fire_due(now)

    def drain_actions(self) -> list[Action]:
        return self._out.drain()

    def handle_packet(self, now: float, data: bytes, from_addr: str) -> None:
        """One UDP datagram. Malformed or unauthenticated packets are dropped and counted."""
        if self._stopped:
            return
        counters = self._counters
        counters.packets_in += 1
        counters.bytes_in += len(data)
        try:
            messages = open_packet(data, self._keyring)
        except DecryptError as exc:
            counters.decrypt_failures += 1
            self._refusals.refused(now, "undecryptable packet dropped", f"{exc} (from {from_addr})")
            return
        except DecodeError as exc:
            counters.malformed_packets += 1
            self._refusals.refused(now, "malformed packet dropped", f"{exc} (from {from_addr})", logging.INFO)
            return
        # Requests that we answer (ping, ping-req) go last, so that an ack carries whatever the rest of
        # the packet provoked -- above all the refutation of a suspicion riding on the ping (buddy system).
        for msg in messages:
            if not isinstance(msg, Ping | IndirectPing):
                self._dispatch(now, msg, from_addr)
        for msg in messages:
            if isinstance(msg, Ping | IndirectPing):
                self._dispatch(now, msg, from_addr)

    def admit_stream(self, now: float, prefix: bytes, from_addr: str) -> bool:
        """Whether to read the rest of an inbound stream frame, given its header and first
        min(length, MAX_PREAUTH_BYTES) payload bytes: with a keyring, only once they authenticate. A refusal
        is counted and logged like a bad frame."""
        if self._stopped:
            return False
        try:
            check_frame_prefix(prefix, self._keyring)
        except DecryptError as exc:
            self._counters.decrypt_failures += 1
            self._refusals.refused(now, "undecryptable stream dropped", f"{exc} (from {from_addr})")
            return False
        except DecodeError as exc:
            self._counters.malformed_packets += 1
            self._refusals.refused(now, "malformed stream dropped", f"{exc} (from {from_addr})", logging.INFO)
            return False
        return True

    def handle_stream(self, now: float, frame: bytes, from_addr: str) -> bytes | None:
        """One inbound stream request frame; returns the reply frame, or None to just close."""
        if self._stopped:
            return None
        counters = self._counters
        counters.streams_in += 1
        counters.bytes_in += len(frame)
        try:
            msg = open_frame(frame, self._keyring)
        except DecryptError as exc:
            counters.decrypt_failures += 1
            self._refusals.refused(now, "undecryptable stream dropped", f"{exc} (from {from_addr})")
            return None
        except DecodeError as exc:
            counters.malformed_packets += 1
            self._refusals.refused(now, "malformed stream dropped", f"{exc} (from {from_addr})", logging.INFO)
            return None
        reply: bytes | None = None
        if isinstance(msg, Ping):
            if not msg.target or msg.target == self.name:
                reply = seal_frame(encode_message(Ack(msg.seq)), self._keyring)
        elif isinstance(msg, PushPull):
            # Reply with our state as it was before merging theirs (memberlist's order).
            reply = self._push_pull_frame(msg.join)
            self._merge(now, msg, from_addr)
        else:
            counters.malformed_packets += 1
        if reply is not None:
            counters.bytes_out += len(reply)
        return reply

    def handle_stream_reply(self, now: float, token: int, reply: bytes | None) -> bool:
        """Outcome of a ``StreamRequest``: the reply frame, or None on failure. True if it succeeded."""
        call = self._streams.pop(token, None)
        if call is None or self._stopped:
            return False
        counters = self._counters
        if reply is None:
            counters.streams_failed += 1
            return False
        counters.bytes_in += len(reply)
        try:
            msg = open_frame(reply, self._keyring)
        except DecryptError:
            counters.decrypt_failures += 1
            return False
        except DecodeError:
            counters.malformed_packets += 1
            return False
        if isinstance(call, _FallbackPing):
            probe = self._probe
            if isinstance(msg, Ack) and msg.seq == call.seq and probe is not None and probe.seq == call.seq:
                probe.fallback_ok = True
                return True
            return False
        if isinstance(msg, PushPull):
            self._merge(now, msg, call.addr)
            return True
        counters.malformed_packets += 1
        return False

    # -- the application's side ------------------------------------------------------------------------

    def join(self, now: float, addrs: list[str]) -> list[int]:
        """Push-pull (join) with each seed address; returns the stream tokens, one per address.

        Raises MeshStateError after ``leave``.
        """
        if self._members.leaving:
            raise MeshStateError("cannot join after leaving")
        return [self._request_push_pull(now, addr, join=True) for addr in addrs]

    def leave(self, now: float) -> None:
        """Gossip a graceful departure; then stop probing. Poll ``leave_complete`` before shutting down."""
        if not self._members.leaving:
            self._members.leave(now)

    @property
    def leave_complete(self) -> bool:
        return self._members.leave_broadcast_done

    def update_meta(self, now: float, meta: NodeMeta) -> None:
        """Publish new metadata for ourselves (others see ``notify_update``)."""
        self._members.update_local_meta(now, meta)

    def stop(self) -> None:
        """Forget every timer and ignore further input (the shell is shutting down)."""
        self._stopped = True
        self._timers.clear()

    def members(self) -> tuple[Member, ...]:
        return self._members.snapshot()

    def member_names(self, states: Collection[MemberState]) -> list[str]:
        return self._members.names_in(states)

    @property
    def size(self) -> int:
        """Members in the table, dead ones until reaped: ``len(members())`` without the snapshots."""
        return self._members.size

    def member(self, name: str) -> Member | None:
        node = self._members.nodes.get(name)
        return None if node is None else node.snapshot()

    @property
    def keyring(self) -> Keyring | None:
        """The live keyring: rotate keys by mutating it (see :mod:`mesh.keyring`)."""
        return self._keyring

    @property
    def incarnation(self) -> int:
        return self._members.local.incarnation

    @property
    def health_score(self) -> int:
        return self._awareness.score

    def metrics(self) -> MeshMetrics:
        return MeshMetrics.build(self._counters, self._members.counts(), self._awareness.score)

    # -- dispatch --------------------------------------------------------------------------------------

    def _dispatch(self, now: float, msg: Message, from_addr: str) -> None:
        members = self._members
        if isinstance(msg, Ping):
            # A ping meant for another member (our address was reused) must not be acked.
            if not msg.target or msg.target == self.name:
                self._out.packet(msg.source_addr, [encode_message(Ack(msg.seq))])
        elif isinstance(msg, Ack):
            self._on_ack(msg.seq)
        elif isinstance(msg, Alive):
            if members.plausible(now, msg, from_addr):
                members.alive(now, msg)
        elif isinstance(msg, Suspect):
            if members.plausible(now, msg, from_addr):
                members.suspect(now, msg)
        elif isinstance(msg, Dead):
            if members.plausible(now, msg, from_addr):
                members.dead(now, msg)
        elif isinstance(msg, IndirectPing):
            self._relay(now, msg)
        elif isinstance(msg, Nack):
            handler = self._acks.get(msg.seq)
            if isinstance(handler, _Probe):
                handler.nacks += 1
                self._counters.nacks_received += 1
        elif isinstance(msg, User) and self._delegate is not None:
            self._delegate.notify_msg(msg.payload)

    def _on_ack(self, seq: int) -> None:
        handler = self._acks.get(seq)
        if isinstance(handler, _Probe):
            if not handler.acked:
                handler.acked = True
                self._awareness.apply_delta(-1)
                if handler.timer is not None:
                    handler.timer.cancel()
        elif isinstance(handler, _Relay):
            del self._acks[seq]
            if handler.timer is not None:
                handler.timer.cancel()
            self._out.packet(handler.source_addr, [encode_message(Ack(handler.source_seq))])

    def _relay(self, now: float, req: IndirectPing) -> None:
        if len(self._acks) >= MAX_PENDING_ACKS:
            self._counters.relays_dropped += 1
            return
        seq = self._next_seq()
        relay = _Relay(req.source_addr, req.seq)
        self._acks[seq] = relay
        self._out.packet(req.target_addr, [encode_message(Ping(seq, req.target, self.name, self.addr))])
        relay.timer = self._timers.call_at(
            now + self._nack_after_s, lambda t: self._relay_timeout(seq, relay, req.nack)
        )

    def _relay_timeout(self, seq: int, relay: _Relay, nack: bool) -> None:
        if self._acks.get(seq) is relay:
            del self._acks[seq]
            if nack:
                self._out.packet(relay.source_addr, [encode_message(Nack(relay.source_seq))])

    # -- probing ---------------------------------------------------------------------------------------

    def _probe_tick(self, now: float) -> None:
        self._finish_probe(now)
        interval = self._awareness.scale(self.config.probe_interval_s)
        self._timers.call_at(now + interval, self._probe_tick)
        if self._members.leaving:
            return
        node = self._members.next_probe_target(now)
        if node is None:
            return
        seq = self._next_seq()
        probe = _Probe(seq, node.name, node.addr, now + interval)
        self._acks[seq] = probe
        self._probe = probe
        parts = [encode_message(Ping(seq, node.name, self.name, self.addr))]
        if node.state == MemberState.SUSPECT and self.config.buddy_system:
            # Buddy system: the suspect hears of the suspicion at once and can refute it.
            parts.append(encode_message(Suspect(node.incarnation, node.name, self.name)))
        self._out.packet(node.addr, parts)
        self._counters.probes_sent += 1
        timeout = self._awareness.scale(self.config.probe_timeout_s)
        probe.timer = self._timers.call_at(now + timeout, lambda t: self._probe_timeout(t, probe))

    def _probe_timeout(self, now: float, probe: _Probe) -> None:
        if probe.acked or self._probe is not probe:
            return
        target = probe.target
        relays = self._members.random_members(
            self.config.indirect_checks,
            lambda n: n.state == MemberState.ALIVE and n.name != target and n is not self._members.local,
        )
        if relays:
            req = encode_message(IndirectPing(probe.seq, target, probe.target_addr, True, self.name, self.addr))
            for relay in relays:
                self._out.packet(relay.addr, [req])
                probe.expected_nacks += 1
                self._counters.indirect_probes_sent += 1
        if not self.config.disable_tcp_pings:
            # UDP may be filtered while TCP works; a TCP ack avoids a false suspicion (memberlist).
            token = self._next_token()
            self._streams[token] = _FallbackPing(probe.seq)
            frame = seal_frame(encode_message(Ping(probe.seq, target, self.name, self.addr)), self._keyring)
            self._out.stream(token, probe.target_addr, frame, probe.deadline)
            self._counters.fallback_probes_sent += 1

    def _finish_probe(self, now: float) -> None:
        probe = self._probe
        if probe is None:
            return
        self._probe = None
        self._acks.pop(probe.seq, None)
        if probe.acked:
            return
        if probe.fallback_ok:
            self._awareness.apply_delta(-1)
            return
        # Relays that did not even nack suggest that we, not the target, are the slow one (Lifeguard).
        if probe.expected_nacks > 0:
            self._awareness.apply_delta(probe.expected_nacks - probe.nacks)
        else:
            self._awareness.apply_delta(1)
        self._counters.probes_failed += 1
        node = self._members.nodes.get(probe.target)
        if node is not None:
            self._members.suspect(now, Suspect(node.incarnation, node.name, self.name))

    # -- gossip and push-pull ----------------------------------------------------------------------------

    def _gossip_tick(self, now: float) -> None:
        self._timers.call_at(now + self.config.gossip_interval_s, self._gossip_tick)
        if not self._out.has_broadcasts:
            return  # nothing could be sent: skip picking targets (most ticks of a quiet cluster)
        horizon = self.config.gossip_to_the_dead_time_s
        local = self._members.local

        def accept(n: NodeState) -> bool:
            if n is local:
                return False
            if n.state == MemberState.DEAD:
                return now - n.state_change < horizon
            return n.state != MemberState.LEFT

        for node in self._members.random_members(self.config.gossip_nodes, accept):
            if not self._out.packet(node.addr, [], require_payload=True):
                return

    def _push_pull_tick(self, now: float) -> None:
        interval = push_pull_scale(self.config.push_pull_interval_s, self._members.size)
        self._timers.call_at(now + interval, self._push_pull_tick)
        if self._members.leaving:
            return
        local = self._members.local
        peers = self._members.random_members(1, lambda n: n.state == MemberState.ALIVE and n is not local)
        if peers:
            self._request_push_pull(now, peers[0].addr, join=False)

    def _reconnect_tick(self, now: float) -> None:
        self._timers.call_at(now + self.config.reconnect_interval_s, self._reconnect_tick)
        if self._members.leaving:
            return
        candidates = self._members.reconnect_candidates(now)
        if candidates:
            self._request_push_pull(now, self._rng.choice(candidates), join=False)

    def _request_push_pull(self, now: float, addr: str, *, join: bool) -> int:
        token = self._next_token()
        self._streams[token] = _PushPullCall(join, addr)
        self._out.stream(token, addr, self._push_pull_frame(join), now + self.config.tcp_timeout_s)
        return token

    def _push_pull_frame(self, join: bool) -> bytes:
        user_state = self._delegate.local_state(join) if self._delegate is not None else b""
        if len(user_state) > MAX_USER_STATE_BYTES:
            user_state = b""  # a delegate bug must not stop membership sync; see Delegate.local_state
        msg = PushPull(join, self._members.push_pull_state(), user_state)
        return seal_frame(encode_message(msg), self._keyring)

    def _merge(self, now: float, msg: PushPull, source: str) -> None:
        self._counters.push_pulls += 1
        self._members.merge(now, msg.members, source)
        if self._delegate is not None:
            self._delegate.merge_remote_state(msg.user_state, msg.join)

    # -- ids --

    def _cluster_size(self) -> int:
        return self._members.size

    def _next_seq(self) -> int:
        self._seq = self._seq + 1 if self._seq < MAX_U32 else 1
        return self._seq

    def _next_token(self) -> int:
        self._token += 1
        return self._token
