"""A deterministic, in-memory network of SWIM cores on a virtual clock: the mesh's test double.

Faults: per-link loss, delay + jitter (hence reordering), duplication; partitions (per direction, so links
can be asymmetric); crashes and restarts; and stalls of two kinds:

* ``inbound``: the node stops *processing* input (packets, stream requests, replies) while its timers keep
  firing -- Lifeguard's "slow message processing", the case where a slow node accuses healthy ones;
* ``pause``: the whole process is frozen (SIGSTOP): nothing runs; at resume due timers fire first and then
  the queued input, in arrival order -- which is what an asyncio loop does after a stall, since it reads
  one datagram per loop iteration but runs every due timer in the first one.

Streams (TCP) are reliable: never lost, but blocked by partitions (the request then times out at its
deadline) and refused at once by a crashed node. Everything random comes from one seeded RNG, so a
seed reproduces a run exactly. Thousands of simulated seconds run per CPU second for small clusters.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal

from mesh.actions import SendPacket, StreamRequest
from mesh.config import MeshConfig
from mesh.delegate import Delegate
from mesh.keyring import Keyring
from mesh.limits import MAX_PREAUTH_BYTES, STREAM_HEADER_BYTES
from mesh.member import Member, MemberState, NodeMeta
from mesh.swim import Swim

StallMode = Literal["inbound", "pause"]


@dataclass(frozen=True, slots=True)
class Link:
    """One direction of a link. ``delay_s`` is the base one-way latency, ``jitter_s`` a uniform extra."""

    loss: float = 0.0
    delay_s: float = 0.0005
    jitter_s: float = 0.0005
    duplicate: float = 0.0


@dataclass(frozen=True, slots=True)
class Event:
    """A membership event as one observer saw it."""

    time: float
    observer: str
    member: str
    kind: Literal["join", "leave", "update"]
    state: MemberState
    incarnation: int


class _Recorder:
    def __init__(self, net: SimNetwork, observer: str) -> None:
        self._net = net
        self._observer = observer

    def _record(self, kind: Literal["join", "leave", "update"], m: Member) -> None:
        self._net.events.append(Event(self._net.now, self._observer, m.name, kind, m.state, m.incarnation))

    def notify_join(self, member: Member) -> None:
        self._record("join", member)

    def notify_leave(self, member: Member) -> None:
        self._record("leave", member)

    def notify_update(self, member: Member) -> None:
        self._record("update", member)


@dataclass(eq=False)
class SimNode:
    name: str
    addr: str
    swim: Swim
    crashed: bool = False
    stalled_until: float = 0.0
    stall_mode: StallMode = "inbound"
    backlog: list[Callable[[], None]] = field(default_factory=list)
    next_wake: float | None = None

    @property
    def live(self) -> bool:
        return not self.crashed

    def view(self) -> dict[str, Member]:
        return {m.name: m for m in self.swim.members()}


class SimNetwork:
    def __init__(self, seed: int, *, link: Link | None = None) -> None:
        self.now = 0.0
        self.rng = random.Random(seed)
        self.default_link = link or Link()
        self.links: dict[tuple[str, str], Link] = {}
        self.blocked: set[tuple[str, str]] = set()
        self.udp_blocked: set[tuple[str, str]] = set()
        self.nodes: dict[str, SimNode] = {}
        self.events: list[Event] = []
        self._by_addr: dict[str, SimNode] = {}
        self._heap: list[tuple[float, int, Callable[[], None]]] = []
        self._serial = 0
        self._pending_streams: dict[tuple[str, int], bool] = {}
        #: Called with a node after every input, timer or API call it processed (invariant checks).
        self.on_step: Callable[[SimNode], None] | None = None

    # -- building --

    def add_node(
        self,
        config: MeshConfig,
        name: str | None = None,
        *,
        meta: NodeMeta | None = None,
        keyring: Keyring | None = None,
        delegate: Delegate | None = None,
        addr: str | None = None,
    ) -> SimNode:
        index = len(self.nodes)
        name = name or f"n{index}"
        addr = addr or f"10.{index // 65536}.{index // 256 % 256}.{index % 256}:7946"
        swim = Swim(
            config.with_(node_name=name),
            addr=addr,
            now=self.now,
            rng=random.Random(self.rng.getrandbits(64)),
            meta=meta,
            keyring=keyring,
            delegate=delegate,
            events=_Recorder(self, name),
        )
        node = SimNode(name, addr, swim)
        self.nodes[name] = node
        self._by_addr[addr] = node
        self._after(node)
        return node

    def cluster(self, n: int, config: MeshConfig, *, stagger_s: float = 0.05) -> list[SimNode]:
        """``n`` nodes, each joining through the first one, ``stagger_s`` apart."""
        nodes = [self.add_node(config)]
        for _ in range(1, n):
            self.run_for(stagger_s)
            node = self.add_node(config)
            self.join(node, [nodes[0]])
            nodes.append(node)
        return nodes

    def join(self, node: SimNode, seeds: Iterable[SimNode]) -> None:
        node.swim.join(self.now, [s.addr for s in seeds])
        self._after(node)

    def restart(self, node: SimNode, config: MeshConfig, seeds: Iterable[SimNode] = ()) -> SimNode:
        """A new process with the same name and address (incarnation starts over), joining ``seeds``."""
        node.swim.stop()
        node.crashed = False
        node.backlog.clear()
        node.next_wake = None
        node.swim = Swim(
            config.with_(node_name=node.name),
            addr=node.addr,
            now=self.now,
            rng=random.Random(self.rng.getrandbits(64)),
            events=_Recorder(self, node.name),
        )
        self._after(node)
        if seeds:
            self.join(node, seeds)
        return node

    # -- faults --

    def crash(self, node: SimNode) -> None:
        node.crashed = True
        node.swim.stop()
        node.backlog.clear()

    def block(self, src: SimNode, dst: SimNode, *, streams: bool = True) -> None:
        """Drop everything from ``src`` to ``dst`` (one direction); with ``streams=False`` only UDP (a
        firewall that lets TCP through)."""
        (self.blocked if streams else self.udp_blocked).add((src.addr, dst.addr))

    def partition(self, side_a: Iterable[SimNode], side_b: Iterable[SimNode]) -> None:
        b = list(side_b)
        for x in side_a:
            for y in b:
                self.block(x, y)
                self.block(y, x)

    def heal(self) -> None:
        self.blocked.clear()
        self.udp_blocked.clear()

    def set_link(self, src: SimNode, dst: SimNode, link: Link) -> None:
        self.links[(src.addr, dst.addr)] = link

    def stall(self, node: SimNode, start: float, duration_s: float, mode: StallMode = "inbound") -> None:
        self._at(start, lambda: self._stall_begin(node, start + duration_s, mode))

    def periodic_stall(
        self,
        node: SimNode,
        *,
        period_s: float,
        duration_s: float,
        start: float,
        end: float,
        mode: StallMode,
        jitter: bool = True,
    ) -> None:
        """One stall of ``duration_s`` in every ``period_s`` slot from ``start`` to ``end``; with ``jitter``
        at a random offset inside the slot (a fixed phase would lock onto the probe timers' phase)."""
        slot = start
        while slot < end:
            offset = self.rng.uniform(0, period_s - duration_s) if jitter else 0.0
            self.stall(node, slot + offset, duration_s, mode)
            slot += period_s

    # -- running --

    def run_until(self, t: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= t:
            when, _, fn = heapq.heappop(heap)
            self.now = when
            fn()
        self.now = max(self.now, t)

    def run_for(self, dt: float) -> None:
        self.run_until(self.now + dt)

    def run_until_true(self, predicate: Callable[[], bool], *, timeout_s: float, step_s: float = 0.05) -> bool:
        deadline = self.now + timeout_s
        while self.now < deadline:
            if predicate():
                return True
            self.run_for(step_s)
        return predicate()

    def update_meta(self, node: SimNode, meta: NodeMeta) -> None:
        node.swim.update_meta(self.now, meta)
        self._after(node)

    def leave(self, node: SimNode) -> None:
        node.swim.leave(self.now)
        self._after(node)

    def inject(self, dst: SimNode, data: bytes, from_addr: str) -> None:
        """Deliver raw bytes to ``dst`` now, as if a packet arrived from ``from_addr``."""
        self._deliver(dst, lambda: dst.swim.handle_packet(self.now, data, from_addr))

    # -- views --

    def live_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.live]

    def converged(self) -> bool:
        """Every live node sees exactly the live nodes as alive, and nobody else as alive."""
        live = {n.name for n in self.live_nodes()}
        for node in self.live_nodes():
            alive = {m.name for m in node.swim.members() if m.state == MemberState.ALIVE}
            if alive != live:
                return False
        return True

    def all_see(self, member: str, states: set[MemberState], observers: Iterable[SimNode] | None = None) -> bool:
        for node in observers if observers is not None else self.live_nodes():
            m = node.swim.member(member)
            if m is None or m.state not in states:
                return False
        return True

    # -- internals --

    def _at(self, when: float, fn: Callable[[], None]) -> None:
        self._serial += 1
        heapq.heappush(self._heap, (when, self._serial, fn))

    def _stalled(self, node: SimNode) -> bool:
        return self.now < node.stalled_until

    def _stall_begin(self, node: SimNode, until: float, mode: StallMode) -> None:
        if node.crashed:
            return
        if until > node.stalled_until:
            node.stalled_until = until
            node.stall_mode = mode
            self._at(until, lambda: self._stall_end(node, until))

    def _stall_end(self, node: SimNode, until: float) -> None:
        if node.crashed or node.stalled_until != until:
            return
        if node.stall_mode == "pause":
            node.swim.handle_timer(self.now)
        backlog, node.backlog = node.backlog, []
        for fn in backlog:
            fn()
        self._after(node)

    def _deliver(self, node: SimNode, fn: Callable[[], None]) -> None:
        """Run input ``fn`` on ``node`` now, or queue it while the node is stalled."""
        if node.crashed:
            return
        if self._stalled(node):
            node.backlog.append(fn)
            return
        fn()
        self._after(node)

    def _wake(self, node: SimNode, when: float) -> None:
        if node.next_wake == when:
            node.next_wake = None
        if node.crashed:
            return
        if self._stalled(node) and node.stall_mode == "pause":
            return  # the stall end fires due timers
        node.swim.handle_timer(self.now)
        self._after(node)

    def _after(self, node: SimNode) -> None:
        """Carry out what the node asked for, and schedule its next timer wake-up."""
        if self.on_step is not None:
            self.on_step(node)
        for action in node.swim.drain_actions():
            if isinstance(action, SendPacket):
                self._send_packet(node, action)
            else:
                self._send_stream(node, action)
        deadline = node.swim.next_deadline()
        if deadline is not None and (node.next_wake is None or deadline < node.next_wake):
            node.next_wake = deadline
            when = max(deadline, self.now)
            self._at(when, lambda: self._wake(node, deadline))

    def _link(self, src: str, dst: str) -> Link:
        return self.links.get((src, dst), self.default_link)

    def _send_packet(self, src: SimNode, action: SendPacket) -> None:
        dst = self._by_addr.get(action.addr)
        path = (src.addr, action.addr)
        if dst is None or path in self.blocked or path in self.udp_blocked:
            return
        link = self._link(src.addr, dst.addr)
        copies = 2 if link.duplicate and self.rng.random() < link.duplicate else 1
        data, from_addr = action.data, src.addr
        for _ in range(copies):
            if link.loss and self.rng.random() < link.loss:
                continue
            delay = link.delay_s + self.rng.random() * link.jitter_s
            self._at(
                self.now + delay,
                lambda: self._deliver(dst, lambda: dst.swim.handle_packet(self.now, data, from_addr)),
            )

    def _send_stream(self, src: SimNode, req: StreamRequest) -> None:
        key = (src.name, req.token)
        self._pending_streams[key] = True
        swim = src.swim

        def finish(reply: bytes | None) -> None:
            if self._pending_streams.pop(key, None) and src.swim is swim:
                swim.handle_stream_reply(self.now, req.token, reply)

        def on_deadline() -> None:
            if src.crashed or (self._stalled(src) and src.stall_mode == "pause"):
                if src.live:
                    src.backlog.append(lambda: finish(None))
                return
            finish(None)
            self._after(src)

        self._at(req.deadline, on_deadline)
        dst = self._by_addr.get(req.addr)
        if dst is None or (src.addr, dst.addr) in self.blocked or (dst.addr, src.addr) in self.blocked:
            return  # packets vanish: the connect times out at the deadline
        link = self._link(src.addr, dst.addr)
        back = self._link(dst.addr, src.addr)
        if dst.crashed:
            # The host answers with a reset: the connect fails after one round trip.
            self._at(self.now + link.delay_s + back.delay_s, lambda: self._deliver(src, lambda: finish(None)))
            return
        data, from_addr = req.data, src.addr

        def serve() -> None:
            # As the asyncio shell does: admit on the header and first bytes, then the whole frame.
            prefix = data[: STREAM_HEADER_BYTES + MAX_PREAUTH_BYTES]
            admitted = dst.swim.admit_stream(self.now, prefix, from_addr)
            reply = dst.swim.handle_stream(self.now, data, from_addr) if admitted else None
            delay = back.delay_s + self.rng.random() * back.jitter_s
            self._at(self.now + delay, lambda: self._deliver(src, lambda: finish(reply)))

        # A connect handshake and the request: about one and a half round trips.
        delay = 2 * link.delay_s + back.delay_s + self.rng.random() * link.jitter_s
        self._at(self.now + delay, lambda: self._deliver(dst, serve))
