"""The member table and its state machine: alive, suspect, dead and left, ordered by incarnation.

Rules (SWIM with memberlist's refinements), for a message about member M with incarnation i:
  * alive(i) wins over anything of a lower incarnation; about ourselves it is refuted unless it is ours.
  * suspect(i) applies to an alive M with incarnation <= i; a second accuser only shortens the timer.
  * dead(i) applies to a not-yet-gone M with incarnation <= i; when M itself sent it, M *left*.
  * we never accept suspect or dead about ourselves: we refute with a higher incarnation (unless leaving).
  * a name at a new address is a conflict unless the old member left, or has been dead for
    ``dead_node_reclaim_time_s`` (or was reaped).
Every accepted change is re-broadcast (newer updates about M replace older ones in the queue).

Incarnations from the network are checked first (``plausible``), because a forged one could otherwise
evict a live member for good: incarnations are u32, a member refutes with the accused incarnation + 1, and
memberlist accepts any value -- a "dead" at 2**32-1 leaves nothing to refute with (memberlist wraps to 0,
which loses too). So:
  * an accusation (suspect, dead) must name at most MAX_ACCUSED_INCARNATION (2**32-2): a refutation fits;
  * no message may raise a known member's incarnation (ours included) by more than MAX_INCARNATION_JUMP.
    Only a member raises its own incarnation, one step per refutation or metadata change, so real messages
    are a few steps ahead of what we know -- also after a restart, when a member learns its previous life's
    incarnation from an accusation and refutes it. Members we do not know yet take any incarnation.
Refused messages are dropped, counted (``incarnations_refused``) and logged (rate-limited). A forger who can
send packets (no keyring) can still accuse a member at its current incarnation -- which it refutes at once --
or walk it up in steps; reaching the top takes 2**16 accepted forgeries, where there the member keeps its
last incarnation and only its metadata can be pinned. Against forgers, use a keyring.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from mesh.awareness import Awareness
from mesh.broadcast import BroadcastQueue
from mesh.codec import encode_message
from mesh.config import MeshConfig
from mesh.delegate import EventDelegate
from mesh.limits import (
    MAX_ACCUSED_INCARNATION,
    MAX_FAILED_REMEMBERED,
    MAX_INCARNATION_JUMP,
    MAX_MEMBERS,
    MAX_U32,
)
from mesh.member import Member, MemberState, NodeMeta
from mesh.messages import Alive, Dead, PushPullMember, Suspect
from mesh.metrics import Counters
from mesh.ratelog import RefusalLog
from mesh.suspicion import Suspicion, suspicion_timeout
from mesh.timers import Timer, Timers

ALIVE, SUSPECT, DEAD, LEFT = MemberState.ALIVE, MemberState.SUSPECT, MemberState.DEAD, MemberState.LEFT

log = logging.getLogger(__name__)


@dataclass(slots=True, eq=False)
class NodeState:
    """Our mutable view of one member (never handed out; see :meth:`snapshot`)."""

    name: str
    addr: str
    meta: NodeMeta
    incarnation: int
    state: MemberState
    state_change: float

    def snapshot(self) -> Member:
        return Member(self.name, self.addr, self.meta, self.state, self.incarnation, self.state_change)


class Membership:
    def __init__(
        self,
        *,
        config: MeshConfig,
        local: NodeState,
        rng: random.Random,
        broadcasts: BroadcastQueue,
        awareness: Awareness,
        timers: Timers,
        counters: Counters,
        events: EventDelegate | None,
    ) -> None:
        self._config = config
        self.local = local
        self._rng = rng
        self._broadcasts = broadcasts
        self._awareness = awareness
        self._timers = timers
        self._counters = counters
        self._events = events
        self.nodes: dict[str, NodeState] = {}
        #: Probe order: shuffled round-robin, new members inserted at a random offset (SWIM 4.3).
        self._order: list[NodeState] = []
        self._probe_index = 0
        self._suspicions: dict[str, tuple[Suspicion, Timer]] = {}
        #: Reaped departed members (name -> address, time of death or leave, DEAD or LEFT), for reconnects.
        self.failed: dict[str, tuple[str, float, MemberState]] = {}
        self.leaving = False
        self._leave_gossiped = False
        self._refusals = RefusalLog(log)

    # -- views --

    @property
    def size(self) -> int:
        """Members in the table (dead ones until reaped), the ``n`` of every log-scaled formula."""
        return len(self.nodes)

    def snapshot(self) -> tuple[Member, ...]:
        return tuple(node.snapshot() for node in self.nodes.values())

    def names_in(self, states: Collection[MemberState]) -> list[str]:
        """Names of the members in ``states``, without a snapshot of each (periodic callers ask this)."""
        return [node.name for node in self.nodes.values() if node.state in states]

    def counts(self) -> tuple[int, int, int, int]:
        by_state = [0, 0, 0, 0]
        for node in self.nodes.values():
            by_state[node.state] += 1
        return by_state[0], by_state[1], by_state[2], by_state[3]

    def push_pull_state(self) -> tuple[PushPullMember, ...]:
        return tuple(PushPullMember(n.name, n.addr, n.meta, n.incarnation, n.state) for n in self.nodes.values())

    def random_members(self, k: int, accept: Callable[[NodeState], bool]) -> list[NodeState]:
        """Up to ``k`` distinct random members passing ``accept`` (memberlist's kRandomNodes)."""
        order = self._order
        n = len(order)
        picked: list[NodeState] = []
        if k <= 0 or n == 0:
            return picked
        for _ in range(3 * n):
            if len(picked) >= k:
                break
            node = order[self._rng.randrange(n)]
            if node not in picked and accept(node):
                picked.append(node)
        return picked

    def next_probe_target(self, now: float) -> NodeState | None:
        """The next member to probe in round-robin order, reshuffling (and reaping) at each wrap."""
        checked = 0
        while checked <= 2 * len(self._order):
            if self._probe_index >= len(self._order):
                self._reset(now)
                self._probe_index = 0
                checked += 1
                if not self._order:
                    return None
                continue
            node = self._order[self._probe_index]
            self._probe_index += 1
            if node is self.local or node.state.is_gone:
                checked += 1
                continue
            return node
        return None

    def reconnect_candidates(self, now: float) -> list[str]:
        """Addresses of departed members worth a reconnect attempt: failed ones (a partition may have healed)
        for ``reconnect_timeout_s``, and ones that left for ``left_reconnect_timeout_s`` (a node restarted
        without a seed to join would otherwise stay a cluster of its own)."""
        horizons = {DEAD: self._config.reconnect_timeout_s, LEFT: self._config.left_reconnect_timeout_s}
        out = [n.addr for n in self.nodes.values() if n.state in horizons and now - n.state_change < horizons[n.state]]
        out.extend(addr for addr, died, state in self.failed.values() if now - died < horizons[state])
        return out

    def plausible(self, now: float, update: Alive | Suspect | Dead, source: str) -> bool:
        """Whether an update from the network may be applied (see the module docstring); counts and logs
        the refused ones. ``source`` names where it came from, for the log."""
        accusation = not isinstance(update, Alive)
        node = self.nodes.get(update.node)
        inc = update.incarnation
        if accusation and inc > MAX_ACCUSED_INCARNATION:
            why = f"above {MAX_ACCUSED_INCARNATION}, which would leave nothing to refute with"
        elif node is not None and inc > node.incarnation + MAX_INCARNATION_JUMP:
            why = f"{inc - node.incarnation} steps above the known {node.incarnation}"
        else:
            return True
        self._counters.incarnations_refused += 1
        kind = type(update).__name__.lower()
        detail = f"{kind} about {update.node!r} at incarnation {inc} from {source}: {why}"
        self._refusals.refused(now, "implausible incarnation refused", detail)
        return False

    # -- transitions --

    def bootstrap(self, now: float) -> None:
        """Announce ourselves alive with the next incarnation (start, or a metadata change)."""
        local = self.local
        inc = min(local.incarnation + 1, MAX_U32)
        self.alive(now, Alive(inc, local.name, local.addr, local.meta), bootstrap=True)

    def alive(self, now: float, a: Alive, *, bootstrap: bool = False) -> None:
        if self.leaving and a.node == self.local.name:
            return
        node = self.nodes.get(a.node)
        is_new = node is None
        updates_addr = False
        if node is None:
            if len(self.nodes) >= MAX_MEMBERS:
                return
            if a.node == self.local.name:
                node = self.local
                node.state = DEAD  # so that our own start reads as a join, like anyone else's
            else:
                node = NodeState(a.node, a.addr, a.meta, 0, DEAD, now)
            self.nodes[a.node] = node
            # Random offset, not append: new members would otherwise all be probed last.
            offset = self._rng.randint(0, len(self._order))
            self._order.insert(offset, node)
        elif node.addr != a.addr:
            reclaim = self._config.dead_node_reclaim_time_s
            can_reclaim = reclaim > 0 and now - node.state_change > reclaim
            if node.state == LEFT or (node.state == DEAD and can_reclaim):
                updates_addr = True
            else:
                return  # conflicting address for a live name: keep the incumbent
        is_local = node is self.local
        stale = a.incarnation < node.incarnation or (a.incarnation == node.incarnation and not is_local)
        if stale and not is_new and not updates_addr:
            return
        self._clear_suspicion(a.node)
        old_state, old_meta = node.state, node.meta
        if is_local and not bootstrap and not is_new:
            if a.incarnation == node.incarnation and a.meta == node.meta:
                return
            self.refute(now, a.incarnation)
        else:
            self._broadcasts.queue(encode_message(a), name=a.node)
            node.incarnation = a.incarnation
            node.meta = a.meta
            node.addr = a.addr
            if node.state != ALIVE:
                node.state = ALIVE
                node.state_change = now
            self.failed.pop(a.node, None)
        if self._events is not None:
            if old_state.is_gone:
                self._events.notify_join(node.snapshot())
            elif old_meta != node.meta:
                self._events.notify_update(node.snapshot())

    def suspect(self, now: float, s: Suspect) -> None:
        node = self.nodes.get(s.node)
        if node is None:
            return
        if s.incarnation < node.incarnation:
            if node is self.local:
                self._reassert()
            return
        current = self._suspicions.get(s.node)
        if current is not None:
            suspicion, timer = current
            if suspicion.confirm(s.sender):
                # New information: re-gossip it so others get the confirmation too, and shorten our timer.
                self._broadcasts.queue(encode_message(s), name=s.node)
                timer.cancel()
                change = node.state_change
                retimed = self._timers.call_at(suspicion.deadline(), lambda t: self._expire(t, s.node, change))
                self._suspicions[s.node] = (suspicion, retimed)
            return
        if node.state != ALIVE:
            return
        if node is self.local:
            self.refute(now, s.incarnation)
            return
        self._broadcasts.queue(encode_message(s), name=s.node)
        node.incarnation = s.incarnation
        node.state = SUSPECT
        node.state_change = now
        self._counters.suspicions += 1
        # Expect k confirmations from other probers: the nominal timeout is then reached two probe
        # intervals before mult x interval, given no phase relation between probers (memberlist).
        n = self.size
        k = self._config.suspicion_mult - 2
        if n - 2 < k:
            k = 0
        min_s = suspicion_timeout(self._config.suspicion_mult, n, self._config.probe_interval_s)
        max_s = self._config.suspicion_max_timeout_mult * min_s
        suspicion = Suspicion(s.sender, k, min_s, max_s, now)
        change = now
        timer = self._timers.call_at(suspicion.deadline(), lambda t: self._expire(t, s.node, change))
        self._suspicions[s.node] = (suspicion, timer)

    def dead(self, now: float, d: Dead) -> None:
        node = self.nodes.get(d.node)
        if node is None:
            return
        if d.incarnation < node.incarnation:
            if node is self.local:
                self._reassert()
            return
        self._clear_suspicion(d.node)
        if node.state.is_gone:
            # A node's own leave outranks a failure verdict reached meanwhile (it may have reached us after
            # others declared it dead): record the graceful departure and pass it on. Nothing else changes.
            if node.state == DEAD and d.node == d.sender and node is not self.local:
                node.state = LEFT
                node.state_change = now
                self._counters.leaves += 1
                self._broadcasts.queue(encode_message(d), name=d.node)
            return
        if node is self.local:
            if not self.leaving:
                self._refusals.refused(
                    now, "declared dead by a peer, refuting", f"{d.sender!r} at incarnation {d.incarnation}"
                )
                self.refute(now, d.incarnation)
                return
            self._broadcasts.queue(encode_message(d), name=d.node, on_done=self._leave_sent)
        else:
            self._broadcasts.queue(encode_message(d), name=d.node)
        node.incarnation = d.incarnation
        node.state = LEFT if d.node == d.sender else DEAD
        node.state_change = now
        if node.state == LEFT:
            self._counters.leaves += 1
        else:
            self._counters.deaths += 1
        if self._events is not None:
            self._events.notify_leave(node.snapshot())

    def refute(self, now: float, accused_incarnation: int) -> None:
        """Out-bid an accusation against us: a higher incarnation, re-announced as alive."""
        local = self.local
        local.incarnation = min(max(local.incarnation, accused_incarnation) + 1, MAX_U32)
        # Being accused is a sign that we are the slow one (Lifeguard).
        self._awareness.apply_delta(1)
        self._counters.refutations += 1
        alive = Alive(local.incarnation, local.name, local.addr, local.meta)
        self._broadcasts.queue(encode_message(alive), name=local.name)

    def _reassert(self) -> None:
        """Someone still accuses an incarnation we already refuted: the refutation missed them (an
        epidemic reaches everyone only with high probability), so gossip our current alive again. Not
        part of memberlist; peers that have it ignore the equal incarnation, so nothing cascades."""
        if self.leaving:
            return
        local = self.local
        alive = Alive(local.incarnation, local.name, local.addr, local.meta)
        self._broadcasts.queue(encode_message(alive), name=local.name)

    def merge(self, now: float, members: Iterable[PushPullMember], source: str) -> None:
        """Merge a peer's full state. A peer's "dead" only makes us suspect: we check for ourselves."""
        for r in members:
            update: Alive | Suspect | Dead
            if r.state == ALIVE:
                update = Alive(r.incarnation, r.name, r.addr, r.meta)
            elif r.state == LEFT:
                update = Dead(r.incarnation, r.name, r.name)
            else:
                update = Suspect(r.incarnation, r.name, self.local.name)
            if not self.plausible(now, update, source):
                continue
            if isinstance(update, Alive):
                self.alive(now, update)
            elif isinstance(update, Dead):
                self.dead(now, update)
            else:
                self.suspect(now, update)

    def leave(self, now: float) -> None:
        """Announce a graceful departure; ``leave_broadcast_done`` turns true once it was gossiped."""
        self.leaving = True
        local = self.local
        self.dead(now, Dead(local.incarnation, local.name, local.name))

    @property
    def leave_broadcast_done(self) -> bool:
        """Our leave was sent its retransmit limit, or nobody is left to tell it: every other member is dead
        or left. Gossip never targets a member that left, so when all members leave at once (the processes
        of ``serve --processes N``) the last transmissions have nowhere to go and waiting for them would
        only run out ``leave_timeout_s``. O(members), polled only while leaving."""
        if self._leave_gossiped:
            return True
        if not self.leaving:
            return False
        local = self.local
        return not any(n is not local and not n.state.is_gone for n in self.nodes.values())

    def update_local_meta(self, now: float, meta: NodeMeta) -> None:
        """Publish new metadata for ourselves under the next incarnation."""
        local = self.local
        inc = min(local.incarnation + 1, MAX_U32)
        self.alive(now, Alive(inc, local.name, local.addr, meta), bootstrap=True)

    # -- internals --

    def _expire(self, now: float, name: str, change: float) -> None:
        node = self.nodes.get(name)
        if node is not None and node.state == SUSPECT and node.state_change == change:
            self.dead(now, Dead(node.incarnation, name, self.local.name))

    def _clear_suspicion(self, name: str) -> None:
        current = self._suspicions.pop(name, None)
        if current is not None:
            current[1].cancel()

    def _leave_sent(self) -> None:
        self._leave_gossiped = True

    def _reset(self, now: float) -> None:
        """Reap members gone for longer than gossip_to_the_dead_time_s, then reshuffle the probe order."""
        horizon = self._config.gossip_to_the_dead_time_s
        keep: list[NodeState] = []
        for node in self._order:
            if node is not self.local and node.state.is_gone and now - node.state_change > horizon:
                del self.nodes[node.name]
                self._remember_failed(node)
            else:
                keep.append(node)
        self._rng.shuffle(keep)
        self._order = keep

    def _remember_failed(self, node: NodeState) -> None:
        if len(self.failed) >= MAX_FAILED_REMEMBERED:
            oldest = min(self.failed, key=lambda name: self.failed[name][1])
            del self.failed[oldest]
        self.failed[node.name] = (node.addr, node.state_change, node.state)
