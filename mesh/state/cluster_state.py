"""Replicated cluster state on pycrdt (Yrs), carried by the mesh: the application's side of `Delegate`.

    state = ClusterState("gw-1", StateConfig())
    async with Mesh(config, delegate=state) as mesh:           # deltas ride on gossip, state on push-pull
        state.set_row("health", {"load": 3, "ok": True})       # our row; every node has one per table
        state.add("workers", "w-17", {"url": "grpc://..."}, now)  # shared registry, any node adds/removes
        state.incr("tenant-a", "rpm", 60.0, now)               # cluster-wide rate-limit counter
        state.subscribe(on_change)                             # Change(kind, table, key, value, ...)
        ... every tick_interval_s: state.tick(now, alive_member_names)

What is stored where (one pycrdt document per table shard, a flat map of JSON text; see crdt_doc.py):
rows (rows.py), registries (registry.py), counters (counters.py). How it travels:
local writes become deltas (one Yrs transaction update each, with a versioned header, wire.py)
piggybacked on gossip and relayed by every receiver (gossip.py); push-pull carries each document
as a diff against what every live peer has reached, or in full on a join (sync.py).

Garbage collection and compaction, run by ``tick``:
* the *janitor* — the live node with the smallest name (membership is the node's input to ``tick``) —
  deletes the rows and counter shards of nodes dead or left for ``dead_gc_delay_s`` and adopts their
  registry slots. Deletes are idempotent and never touch a write they have not seen, so two nodes that
  both believe they are the janitor (a partition) do no harm, and a node wrongly declared dead simply
  re-asserts its rows (the owner is authoritative for them);
* when a document's encoded size passes ``max_doc_bytes`` and is mostly garbage (tombstones of
  restarted writers, registry churn), the janitor rebuilds it as a fresh document from its current
  values under a new *generation* ``(number + 1, janitor)``. Yrs cannot merge the two lineages (their
  items differ, so a state-vector sync would double everything), hence generations never mix: deltas of
  another generation are dropped, and a push-pull section of a higher generation *replaces* the
  document wholesale. The highest generation — ordered by (number, compactor name), so concurrent
  compactions tie-break the same way everywhere — spreads by push-pull until every node has it. On
  adoption each node re-asserts its own rows and counter shards and re-adds registry entries it knows
  better than the compactor (a value-level last-writer-wins join), so writes made in the old generation
  after the compaction are not lost. Until then the two groups do not see each other's new deltas: at
  most a few push-pull intervals, and compaction is rare since rows never grow their documents.

Threading: every method, the Delegate ones included (called synchronously by the mesh core), must run
on the one thread/task that owns the state — the mesh's event loop. No clock is read: time comes in.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, fields

from mesh.limits import MAX_USER_STATE_BYTES
from mesh.state.config import KEY_SEPARATOR, StateConfig, check_table_name
from mesh.state.counters import Counters
from mesh.state.crdt_doc import KeyChange, Replica
from mesh.state.gossip import DeltaGossip
from mesh.state.hlc import HybridClock
from mesh.state.members import MemberView
from mesh.state.registry import Registry, parse_registry_doc, registry_doc_name
from mesh.state.rows import RowTables, parse_row_doc
from mesh.state.sync import PeerKnowledge
from mesh.state.values import Change, Json, Row, StateLimitError, StateMetrics
from mesh.state.wire import (
    Delta,
    DocState,
    Generation,
    PeerState,
    StateDecodeError,
    decode_delta,
    decode_state,
    decode_sv,
    encode_delta,
    encode_state,
    encode_sv,
    sv_covers,
)

log = logging.getLogger(__name__)

#: How often tick() rebuilds the set of nodes known from rows but not alive when membership did not change:
#: a dead node's late rows are noticed this late at most (they are collected dead_gc_delay_s after it died).
MEMBERS_REFRESH_S = 1.0

Subscriber = Callable[[Change], None]


@dataclass(slots=True)
class _Counts:
    deltas_out: int = 0
    deltas_oversized: int = 0
    deltas_in: int = 0
    deltas_applied: int = 0
    deltas_duplicate: int = 0
    deltas_held: int = 0
    deltas_stale: int = 0
    malformed: int = 0
    states_out_full: int = 0
    states_out_diff: int = 0
    states_in: int = 0
    state_bytes_out: int = 0
    compactions: int = 0
    adoptions: int = 0
    counter_flush_failures: int = 0


class _Writer:
    """The DocWriter the tables write through (keeps ``ClusterState.write`` out of the public API)."""

    __slots__ = ("_state",)

    def __init__(self, state: ClusterState) -> None:
        self._state = state

    def write(self, doc: str, sets: Mapping[str, str | None]) -> None:
        self._state._write(doc, sets)


class ClusterState:
    """The replicated state of one node. Not thread-safe: one owner (the mesh's event loop)."""

    def __init__(self, node_id: str, config: StateConfig | None = None) -> None:
        """Raises ValueError for an empty node id or one containing the key separator."""
        if not node_id or KEY_SEPARATOR in node_id or len(node_id.encode()) > 128:
            raise ValueError(f"node_id: 1..128 bytes without \\x1f, got {node_id!r}")
        self.node_id = node_id
        self.config = config or StateConfig()
        self._docs: dict[str, Replica] = {}
        self._counts = _Counts()
        self._clock = HybridClock()
        writer = _Writer(self)
        self._rows = RowTables(node_id, self.config, writer)
        self._registry = Registry(node_id, self.config, writer, self._clock)
        self._counters = Counters(node_id, self.config, self._rows)
        self._gossip = DeltaGossip(
            self.config.retransmit_mult,
            max_seen=self.config.max_seen_deltas,
            max_held=self.config.max_pending_deltas,
            max_queued=self.config.max_queued_deltas,
        )
        self._knowledge = PeerKnowledge()
        self._members = MemberView(node_id)
        self._subscribers: list[Subscriber] = []
        self._events: list[Change] = []
        self._notifying = False
        self._next_housekeeping: float | None = None
        self._last_alive: frozenset[str] | None = None
        self._next_members_update = -math.inf
        self._doc_bytes = 0
        self._flush_failing = False

    # -- rows ------------------------------------------------------------------------------------------

    def set_row(self, table: str, row: Row) -> None:
        """Replace our row in ``table``. Raises ValueError for a bad table name or a non-JSON row,
        StateLimitError past max_row_bytes / max_docs."""
        check_table_name(table)
        self._rows.set_row(table, row)
        self._notify()

    def delete_row(self, table: str) -> None:
        check_table_name(table)
        self._rows.delete_row(table)
        self._notify()

    def rows(self, table: str, *, live_only: bool = False) -> Mapping[str, Row]:
        """Every node's row in ``table`` (node id -> row); with ``live_only``, only members ``tick`` was
        last told are alive. A live read-only view (copy it to keep a snapshot); do not mutate it."""
        rows = self._rows.rows(table)
        if not live_only or self._members.alive is None:
            return rows
        return {node: row for node, row in rows.items() if self._members.is_live(node)}

    # -- registries ------------------------------------------------------------------------------------

    def add(self, table: str, key: str, value: Json, now: float) -> None:
        """Add or replace an entry of a shared registry. Raises ValueError for a bad table, key or value,
        StateLimitError past max_row_bytes / max_docs."""
        check_table_name(table)
        self._registry.add(table, key, value, now)
        self._notify()

    def remove(self, table: str, key: str, now: float) -> None:
        check_table_name(table)
        self._registry.remove(table, key, now)
        self._notify()

    def entries(self, table: str) -> Mapping[str, Json]:
        """The registry's current entries (key -> value). A live read-only view (copy it to keep a
        snapshot); do not mutate it."""
        return self._registry.entries(table)

    # -- counters --------------------------------------------------------------------------------------

    def incr(self, key: str, limit: str, window_s: float, now: float, amount: int = 1) -> int:
        """Count admissions of ``key`` under the limit named ``limit`` (a counter per key, limit name and
        window) in the window containing ``now``; returns the global count.
        Published at the next ``tick``. See counters.py for the over-admission bound. Raises
        ValueError for bad arguments, StateLimitError for a new counter past max_counter_fields (or
        its shard's max_row_bytes): the caller decides whether to admit."""
        return self._counters.incr(key, limit, window_s, now, amount, live=self._is_live)

    def count(self, key: str, limit: str, window_s: float, now: float) -> int:
        return self._counters.count(key, limit, window_s, now, self._is_live)

    def synced_peers(self) -> frozenset[str]:
        """Live peers whose full state or diff we have merged at least once (for a rate limiter: until
        every live member is here, grant each node limit / N)."""
        return self._members.synced_peers()

    # -- subscriptions ---------------------------------------------------------------------------------

    def subscribe(self, callback: Subscriber) -> Callable[[], None]:
        """Call ``callback(change)`` after every visible change to a row or registry entry, local or
        remote (not for counters). Returns an unsubscribe function. Callbacks run synchronously on the
        owner thread and may write; an exception in one is logged and ignored."""
        self._subscribers.append(callback)

        def unsubscribe() -> None:
            if callback in self._subscribers:
                self._subscribers.remove(callback)

        return unsubscribe

    # -- housekeeping ----------------------------------------------------------------------------------

    def tick(self, now: float, alive: Collection[str] | None = None) -> None:
        """Call every ``tick_interval_s``: publishes counters; every ``housekeeping_interval_s`` also
        garbage-collects and compacts. ``alive``: the names of the members currently alive (suspects
        count as alive), or None to keep the last view. A counter flush that fails (a shard past
        max_row_bytes) is logged and counted, and housekeeping runs regardless: GC and compaction must
        never depend on the counters' contents."""
        if alive is not None:
            # A changed membership applies at once; otherwise only the "known but not alive" set can move
            # (rows of a dead node arriving late), and it is rebuilt from every row, so not on every tick.
            alive_now = frozenset(alive)
            if alive_now != self._last_alive or now >= self._next_members_update:
                self._last_alive = alive_now
                self._next_members_update = now + MEMBERS_REFRESH_S
                self._update_members(now, alive_now)
        try:
            self._counters.flush(now)
        except StateLimitError as exc:
            self._counts.counter_flush_failures += 1
            if not self._flush_failing:
                log.warning("state: counters not published until it fits: %s", exc)
            self._flush_failing = True
        else:
            self._flush_failing = False
        if self._next_housekeeping is None or now >= self._next_housekeeping:
            self._next_housekeeping = now + self.config.housekeeping_interval_s
            self._housekeeping(now)
        self._notify()

    def _update_members(self, now: float, alive: Collection[str]) -> None:
        known = self._rows.owners() | self._registry_owners() | self._knowledge.peers() | self._members.known_synced()
        self._members.update(now, alive, known, self.config.dead_gc_delay_s + self.config.tombstone_ttl_s)

    def _registry_owners(self) -> set[str]:
        owners: set[str] = set()
        for name, replica in self._docs.items():
            if parse_registry_doc(name) is not None:
                owners.update(key.rpartition(KEY_SEPARATOR)[2] for key in replica.values)
        return owners

    def _housekeeping(self, now: float) -> None:
        gone = self._members.gone_for(now, self.config.dead_gc_delay_s)
        janitor = self._members.is_janitor()
        if janitor and gone:
            self._rows.collect({name: list(r.values) for name, r in self._docs.items()}, gone)
        self._registry.collect(now, gone, janitor=janitor)
        self._knowledge.forget(gone)
        self._members.forget(gone)
        total = 0
        for name, replica in list(self._docs.items()):
            size = replica.encoded_size()
            if janitor and size > self.config.max_doc_bytes and _mostly_garbage(replica, size):
                gen = Generation(replica.gen.number + 1, self.node_id, int(now * 1000))
                rebuilt = Replica.rebuilt(name, gen, replica.values)
                self._docs[name] = rebuilt
                self._gossip.drop_doc(name)
                self._counts.compactions += 1
                size = rebuilt.encoded_size()
                log.info("state: compacted %s to generation %d", name, gen.number)
            total += size
        self._doc_bytes = total

    # -- observability ---------------------------------------------------------------------------------

    def metrics(self) -> StateMetrics:
        counts = {f.name: getattr(self._counts, f.name) for f in fields(_Counts)}
        return StateMetrics(
            **counts,
            deltas_dropped=self._gossip.dropped,
            counters_refused=self._counters.refused,
            docs=len(self._docs),
            doc_bytes=self._doc_bytes,
        )

    def doc_sizes(self) -> dict[str, int]:
        """Encoded bytes of every document, measured now (an encode each: not for hot paths)."""
        return {name: replica.encoded_size() for name, replica in self._docs.items()}

    def generation(self, doc: str) -> Generation | None:
        replica = self._docs.get(doc)
        return replica.gen if replica is not None else None

    def doc_names(self) -> list[str]:
        return sorted(self._docs)

    def doc_values(self, doc: str) -> Mapping[str, str]:
        """The raw stored values of one document (tests compare replicas with it)."""
        replica = self._docs.get(doc)
        return dict(replica.values) if replica is not None else {}

    # -- Delegate --------------------------------------------------------------------------------------

    def local_state(self, join: bool) -> bytes:
        peers = self._members.peers()
        sections = []
        for name, replica in self._docs.items():
            base = None if join or peers is None else self._knowledge.base(name, replica.gen, peers)
            if base is None:
                sections.append(DocState(name, replica.gen, True, replica.sv_bytes(), b"", replica.full()))
                self._counts.states_out_full += 1
            else:
                update = replica.diff(base)
                sections.append(DocState(name, replica.gen, False, replica.sv_bytes(), encode_sv(base), update))
                self._counts.states_out_diff += 1
        raw = encode_state(PeerState(self.node_id, tuple(sections)))
        if len(raw) > MAX_USER_STATE_BYTES:
            log.warning("state: %d bytes exceed the push-pull bound; documents need compaction", len(raw))
        self._counts.state_bytes_out += len(raw)
        return raw

    def merge_remote_state(self, state: bytes, join: bool) -> None:
        if not state:
            return
        try:
            peer = decode_state(state)
        except StateDecodeError:
            self._counts.malformed += 1
            return
        if peer.node == self.node_id:
            return
        self._counts.states_in += 1
        self._members.synced(peer.node)
        for section in peer.docs:
            try:
                self._merge_section(peer.node, section)
            except StateDecodeError:
                self._counts.malformed += 1
        self._notify()

    def get_broadcasts(self, overhead: int, limit: int) -> list[bytes]:
        if not len(self._gossip):
            return []
        return self._gossip.take(overhead, limit, self._cluster_size(), self._encode_range)

    def notify_msg(self, msg: bytes) -> None:
        self._counts.deltas_in += 1
        if self._gossip.seen(msg):
            self._counts.deltas_duplicate += 1
            return
        try:
            delta = decode_delta(msg)
        except StateDecodeError:
            self._counts.malformed += 1
            return
        self._receive(delta, msg)
        self._notify()

    # -- internals: receiving --------------------------------------------------------------------------

    def _receive(self, delta: Delta, raw: bytes) -> None:
        replica = self._docs.get(delta.doc)
        if replica is None:
            if delta.gen.number != 0 or not self._valid_doc(delta.doc) or len(self._docs) >= self.config.max_docs:
                self._counts.deltas_stale += 1  # a compacted document is only ever taken whole (push-pull)
                return
            replica = self._docs[delta.doc] = Replica(delta.doc, delta.gen)
        if delta.gen != replica.gen:
            self._counts.deltas_stale += 1
            return
        clock = replica.clock(delta.client)
        if delta.end > delta.start and clock >= delta.end:
            self._counts.deltas_duplicate += 1
            return
        if delta.start > clock:
            self._counts.deltas_held += 1
            self._gossip.hold(delta, raw)
            return
        try:
            changes = replica.apply(delta.update)
        except StateDecodeError:
            self._counts.malformed += 1
            return
        self._counts.deltas_applied += 1
        if delta.end > delta.start and delta.doc.startswith("r/"):
            self._gossip.offer_range(delta.doc, delta.client, delta.start)
        else:
            self._gossip.offer_raw(raw, delta.doc)
        self._dispatch(delta.doc, changes, local=False)
        self._release_held(delta.doc)

    def _release_held(self, doc: str) -> None:
        replica = self._docs.get(doc)
        if replica is None:
            return
        for client in self._gossip.held_writers(doc):
            for delta, raw in self._gossip.release(doc, client, replica.clock(client)):
                self._receive(delta, raw)

    def _merge_section(self, peer: str, section: DocState) -> None:
        """Raises StateDecodeError."""
        if not self._valid_doc(section.doc):
            raise StateDecodeError(f"unknown document {section.doc!r}")
        self._knowledge.learn(peer, section.doc, section.gen, decode_sv(section.sv))
        base = decode_sv(section.base)
        replica = self._docs.get(section.doc)
        if replica is None:
            if base or len(self._docs) >= self.config.max_docs:
                return
            replica = self._docs[section.doc] = Replica(section.doc, section.gen)
        if section.gen > replica.gen:
            if section.full:
                self._adopt(replica, section)
            return
        if section.gen < replica.gen or not sv_covers(replica.sv(), base):
            return  # they will take ours; or a base we have not reached (see sync.py)
        self._dispatch(section.doc, replica.apply(section.update), local=False)
        self._release_held(section.doc)

    def _adopt(self, old: Replica, section: DocState) -> None:
        """Replace a document by a peer's higher generation (see the module docstring)."""
        new = Replica(section.doc, section.gen)
        new.apply(section.update)
        before, after = old.values, new.values
        changes = [KeyChange(k, before.get(k), after.get(k)) for k in before.keys() | after.keys()]
        changes = [c for c in changes if c.old != c.new]
        table = parse_registry_doc(section.doc)
        old_winners = self._registry.winners(table) if table is not None else {}
        self._docs[section.doc] = new
        self._gossip.drop_doc(section.doc)
        self._counts.adoptions += 1
        self._dispatch(section.doc, changes, local=False)
        if table is not None:
            self._registry.merge_old_view(table, old_winners, section.gen.wall_ms)

    # -- internals: writing ----------------------------------------------------------------------------

    def _write(self, doc: str, sets: Mapping[str, str | None]) -> None:
        replica = self._docs.get(doc)
        if replica is None:
            if all(v is None for v in sets.values()):
                return
            if len(self._docs) >= self.config.max_docs:
                raise StateLimitError(f"{doc!r}: more than max_docs={self.config.max_docs} documents")
            replica = self._docs[doc] = Replica(doc, Generation(0, ""))
        write, changes = replica.write(sets)
        if write is not None:
            self._counts.deltas_out += 1
            if write.end > write.start and doc.startswith("r/"):
                self._gossip.offer_range(doc, write.client, write.start)
            else:
                raw = encode_delta(Delta(doc, replica.gen, write.client, write.start, write.end, write.update))
                self._gossip.seen(raw)
                if len(raw) > self.config.max_delta_bytes:
                    self._counts.deltas_oversized += 1  # push-pull carries it
                else:
                    self._gossip.offer_raw(raw, doc)
        self._dispatch(doc, changes, local=True)

    def _encode_range(self, doc: str, client: int, start: int) -> bytes | None:
        """The delta of ``client``'s updates in ``doc`` up to what we have now, as our replica holds
        them. Preferably from clock 0: in a row document each writer overwrites one key, so its whole
        history is garbage but for the latest value and costs about one value; a receiver that missed
        any earlier delta can then never be left with a hole. If that is too big for gossip (a
        compactor's copies of every row), from ``start``; None if even that is (push-pull carries it)."""
        replica = self._docs.get(doc)
        if replica is None:
            return None
        end = replica.clock(client)
        if end <= start:
            return None
        sv = dict(replica.sv())
        for begin in dict.fromkeys((0, start)):
            update = replica.structs_since({**sv, client: begin}, sv)
            raw = encode_delta(Delta(doc, replica.gen, client, begin, end, update))
            if len(raw) <= self.config.max_delta_bytes:
                return raw
        self._counts.deltas_oversized += 1
        return None

    def _dispatch(self, doc: str, changes: Iterable[KeyChange], *, local: bool) -> None:
        if doc.startswith("r/"):
            self._events.extend(self._rows.on_changes(doc, changes, local=local))
        elif doc.startswith("g/"):
            self._events.extend(self._registry.on_changes(doc, changes, local=local))

    def _notify(self) -> None:
        if self._notifying:
            return  # a subscriber wrote: its events are delivered by the loop below
        self._notifying = True
        try:
            while self._events:
                events, self._events = self._events, []
                for event in events:
                    for callback in list(self._subscribers):
                        try:
                            callback(event)
                        except Exception:
                            log.exception("state: subscriber failed on %s", event)
        finally:
            self._notifying = False

    # -- internals: membership -------------------------------------------------------------------------

    def _is_live(self, node: str) -> bool:
        return self._members.is_live(node)

    def _cluster_size(self) -> int:
        return self._members.size()

    @staticmethod
    def _valid_doc(name: str) -> bool:
        if parse_row_doc(name) is not None:
            return True
        table = parse_registry_doc(name)
        return table is not None and registry_doc_name(table) == name


def _mostly_garbage(replica: Replica, size: int) -> bool:
    """Whether rebuilding would at least halve the document (live data alone may exceed the bound:
    compacting then would only churn generations)."""
    live = sum(len(k) + len(v) + 16 for k, v in replica.values.items())
    return size > 2 * live
