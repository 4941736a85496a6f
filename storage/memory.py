"""The embedded backend: per-process dicts, bounded in size and age. Lost on restart; not shared by nodes.

Eviction works on whole entries (a response with its items, or a conversation with its items), never on
single items, so a surviving conversation is always complete. An entry weighs 1 + its item count.
- Age: an entry is dropped `retention_s` after its last write (reads do not extend it), matching the
  Redis backend's TTLs and the Postgres backend's expires_at (see storage/base.py).
- Size: while the total weight exceeds `max_items`, the least recently used entry (read or written)
  is dropped. A write that alone would exceed `max_items` is refused with InvalidInput.

No method awaits between its checks and its mutations, so every call is atomic on the event loop.
"""

from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, NamedTuple

from storage import codec, validation
from storage.base import (
    DEFAULT_MAX_CHAIN_DEPTH,
    DEFAULT_PAGE_LIMIT,
    Conversation,
    Item,
    ItemPage,
    Order,
    ResponseRecord,
    Stores,
)
from storage.errors import Conflict, InvalidInput, NotFound


class _Blob(NamedTuple):
    """An item as stored: its JSON text, decoded afresh on every read so callers never share state."""

    id: str
    type: str
    text: str

    @classmethod
    def of(cls, item: Item) -> _Blob:
        return cls(item.id, item.type, codec.dumps(item.body))

    def decode(self) -> Item:
        return codec.item_from_text(self.text)


@dataclass(slots=True)
class _Response:
    seq: int
    created_at: int
    previous_response_id: str | None
    conversation_id: str | None
    body_text: str
    output: tuple[_Blob, ...]
    inputs: tuple[_Blob, ...]
    input_index: dict[str, int]

    def record(self, response_id: str) -> ResponseRecord:
        return ResponseRecord(
            id=response_id,
            created_at=self.created_at,
            body=codec.loads_object(self.body_text),
            output=tuple(b.decode() for b in self.output),
            previous_response_id=self.previous_response_id,
            conversation_id=self.conversation_id,
        )


@dataclass(slots=True)
class _Conversation:
    created_at: int
    metadata: dict[str, str]
    # Invariant: `seqs` is ascending and holds exactly the keys of `by_seq`; `seq_of` is its inverse.
    seqs: list[int] = field(default_factory=list)
    by_seq: dict[int, _Blob] = field(default_factory=dict)
    seq_of: dict[str, int] = field(default_factory=dict)
    next_seq: int = 0

    def header(self, conversation_id: str) -> Conversation:
        return Conversation(conversation_id, self.created_at, dict(self.metadata))

    def append(self, blobs: Sequence[_Blob]) -> None:
        for blob in blobs:
            self.seqs.append(self.next_seq)
            self.by_seq[self.next_seq] = blob
            self.seq_of[blob.id] = self.next_seq
            self.next_seq += 1


_Key = tuple[Literal["r", "c"], str, str]


def page_window(count: int, cursor: int | None, limit: int, order: Order) -> tuple[range, bool]:
    """Indices (in output order) of one page over an ascending list of `count` entries, and has_more.
    `cursor` is the index of the `after` entry."""
    if order == "asc":
        start = 0 if cursor is None else cursor + 1
        stop = min(count, start + limit)
        return range(start, stop), stop < count
    stop = count if cursor is None else cursor
    start = max(0, stop - limit)
    return range(stop - 1, start - 1, -1), start > 0


class _State:
    """Entries of both stores plus the LRU and age bookkeeping shared by them."""

    def __init__(self, *, max_items: int, retention_s: float, clock: Callable[[], float]) -> None:
        self.max_items = max_items
        self.retention_s = retention_s
        self.clock = clock
        self.responses: dict[tuple[str, str], _Response] = {}
        self.conversations: dict[tuple[str, str], _Conversation] = {}
        self.next_response_seq = 0
        self._lru: OrderedDict[_Key, int] = OrderedDict()  # key -> weight, least recently used first
        self._written: OrderedDict[_Key, float] = OrderedDict()  # key -> last write, oldest first
        self._weight = 0

    @property
    def weight(self) -> int:
        return self._weight

    def expire(self) -> None:
        """Drop entries whose last write is older than the retention; called at the start of every op."""
        deadline = self.clock() - self.retention_s
        while self._written:
            key, written = next(iter(self._written.items()))
            if written > deadline:
                break
            self.drop(key)

    def touch(self, key: _Key) -> None:
        self._lru.move_to_end(key)

    def check_fits(self, weight: int) -> None:
        if weight > self.max_items:
            raise InvalidInput(f"{weight} items exceed the memory store's capacity of {self.max_items}")

    def wrote(self, *entries: tuple[_Key, int]) -> None:
        """Record writes of (key, new weight) pairs, then evict LRU entries down to capacity.

        The written keys are now last in LRU order and are never evicted by their own write; check_fits()
        ran on their combined weight, so evicting the others always gets back under capacity.
        """
        now = self.clock()
        for key, weight in entries:
            self._weight += weight - self._lru.get(key, 0)
            self._lru[key] = weight
            self._lru.move_to_end(key)
            self._written[key] = now
            self._written.move_to_end(key)
        while self._weight > self.max_items:
            oldest = next(iter(self._lru))
            if any(oldest == key for key, _ in entries):
                break
            self.drop(oldest)

    def drop(self, key: _Key) -> None:
        self._weight -= self._lru.pop(key, 0)
        self._written.pop(key, None)
        kind, tenant, entry_id = key
        if kind == "r":
            self.responses.pop((tenant, entry_id), None)
        else:
            self.conversations.pop((tenant, entry_id), None)


class MemoryResponseStore:
    def __init__(self, state: _State) -> None:
        self._s = state

    async def put(self, tenant: str, response: ResponseRecord, input_items: Sequence[Item]) -> None:
        validation.check_tenant(tenant)
        validation.check_response(response, input_items)
        s = self._s
        s.expire()
        if (tenant, response.id) in s.responses:
            raise Conflict(f"response {response.id!r} already exists")
        prev = response.previous_response_id
        if prev is not None and (tenant, prev) not in s.responses:
            raise NotFound(f"previous response {prev!r} not found")
        weight = 1 + len(input_items) + len(response.output)
        inputs = tuple(_Blob.of(i) for i in input_items)
        output = tuple(_Blob.of(i) for i in response.output)
        body_text = codec.dumps(response.body)
        conv: _Conversation | None = None
        if response.conversation_id is not None:
            conv = s.conversations.get((tenant, response.conversation_id))
            if conv is None:
                raise NotFound(f"conversation {response.conversation_id!r} not found")
            for blob in (*inputs, *output):
                if blob.id in conv.seq_of:
                    raise Conflict(f"item {blob.id!r} already exists in the conversation")
        conv_weight = 0 if conv is None else 1 + len(conv.seqs) + len(inputs) + len(output)
        s.check_fits(weight + conv_weight)
        # All checks passed: mutate.
        s.next_response_seq += 1
        s.responses[(tenant, response.id)] = _Response(
            seq=s.next_response_seq,
            created_at=response.created_at,
            previous_response_id=prev,
            conversation_id=response.conversation_id,
            body_text=body_text,
            output=output,
            inputs=inputs,
            input_index={b.id: i for i, b in enumerate(inputs)},
        )
        if conv is not None and response.conversation_id is not None:
            conv.append((*inputs, *output))
            s.wrote((("r", tenant, response.id), weight), (("c", tenant, response.conversation_id), conv_weight))
        else:
            s.wrote((("r", tenant, response.id), weight))

    def _get(self, tenant: str, response_id: str) -> _Response:
        validation.check_tenant(tenant)
        validation.check_record_id("response", response_id)
        self._s.expire()
        entry = self._s.responses.get((tenant, response_id))
        if entry is None:
            raise NotFound(f"response {response_id!r} not found")
        self._s.touch(("r", tenant, response_id))
        return entry

    async def get(self, tenant: str, response_id: str) -> ResponseRecord:
        return self._get(tenant, response_id).record(response_id)

    async def delete(self, tenant: str, response_id: str) -> None:
        self._get(tenant, response_id)
        self._s.drop(("r", tenant, response_id))

    async def list_input_items(
        self,
        tenant: str,
        response_id: str,
        *,
        after: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        order: Order = "desc",
    ) -> ItemPage:
        validation.check_page(limit, order)
        entry = self._get(tenant, response_id)
        cursor = None
        if after is not None:
            cursor = entry.input_index.get(after)
            if cursor is None:
                raise InvalidInput(f"`after` item {after!r} is not an input item of {response_id!r}")
        window, has_more = page_window(len(entry.inputs), cursor, limit, order)
        return ItemPage(tuple(entry.inputs[i].decode() for i in window), has_more)

    async def load_chain(
        self, tenant: str, response_id: str, *, max_depth: int = DEFAULT_MAX_CHAIN_DEPTH
    ) -> tuple[Item, ...]:
        validation.check_depth(max_depth)
        entry = self._get(tenant, response_id)
        chain = [entry]
        while (prev := chain[-1].previous_response_id) is not None:
            if len(chain) == max_depth:
                raise InvalidInput(f"previous_response_id chain is deeper than {max_depth}")
            parent = self._s.responses.get((tenant, prev))
            # A parent with a larger seq is a newer response reusing a deleted ancestor's id.
            if parent is None or parent.seq >= chain[-1].seq:
                raise NotFound(f"previous response {prev!r} in the chain no longer exists")
            self._s.touch(("r", tenant, prev))
            chain.append(parent)
        return tuple(b.decode() for r in reversed(chain) for b in (*r.inputs, *r.output))


class MemoryConversationStore:
    def __init__(self, state: _State) -> None:
        self._s = state

    def _get(self, tenant: str, conversation_id: str) -> _Conversation:
        validation.check_tenant(tenant)
        validation.check_record_id("conversation", conversation_id)
        self._s.expire()
        conv = self._s.conversations.get((tenant, conversation_id))
        if conv is None:
            raise NotFound(f"conversation {conversation_id!r} not found")
        self._s.touch(("c", tenant, conversation_id))
        return conv

    async def create(self, tenant: str, conversation: Conversation, items: Sequence[Item] = ()) -> Conversation:
        validation.check_tenant(tenant)
        validation.check_record_id("conversation", conversation.id)
        validation.check_metadata(conversation.metadata)
        validation.check_added_items(items, allow_empty=True)
        s = self._s
        s.expire()
        key = (tenant, conversation.id)
        if key in s.conversations:
            raise Conflict(f"conversation {conversation.id!r} already exists")
        s.check_fits(1 + len(items))
        conv = _Conversation(conversation.created_at, dict(conversation.metadata))
        conv.append([_Blob.of(i) for i in items])
        s.conversations[key] = conv
        s.wrote((("c", tenant, conversation.id), 1 + len(items)))
        return conv.header(conversation.id)

    async def get(self, tenant: str, conversation_id: str) -> Conversation:
        return self._get(tenant, conversation_id).header(conversation_id)

    async def update_metadata(self, tenant: str, conversation_id: str, metadata: Mapping[str, str]) -> Conversation:
        validation.check_metadata(metadata)
        conv = self._get(tenant, conversation_id)
        conv.metadata = dict(metadata)
        self._s.wrote((("c", tenant, conversation_id), 1 + len(conv.seqs)))
        return conv.header(conversation_id)

    async def delete(self, tenant: str, conversation_id: str) -> None:
        self._get(tenant, conversation_id)
        self._s.drop(("c", tenant, conversation_id))

    async def add_items(self, tenant: str, conversation_id: str, items: Sequence[Item]) -> None:
        validation.check_added_items(items, allow_empty=False)
        conv = self._get(tenant, conversation_id)
        for item in items:
            if item.id in conv.seq_of:
                raise Conflict(f"item {item.id!r} already exists in conversation {conversation_id!r}")
        weight = 1 + len(conv.seqs) + len(items)
        self._s.check_fits(weight)
        conv.append([_Blob.of(i) for i in items])
        self._s.wrote((("c", tenant, conversation_id), weight))

    async def list_items(
        self,
        tenant: str,
        conversation_id: str,
        *,
        after: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        order: Order = "desc",
    ) -> ItemPage:
        validation.check_page(limit, order)
        conv = self._get(tenant, conversation_id)
        cursor = None
        if after is not None:
            seq = conv.seq_of.get(after)
            if seq is None:
                raise InvalidInput(f"`after` item {after!r} is not in conversation {conversation_id!r}")
            cursor = bisect.bisect_left(conv.seqs, seq)
        window, has_more = page_window(len(conv.seqs), cursor, limit, order)
        return ItemPage(tuple(conv.by_seq[conv.seqs[i]].decode() for i in window), has_more)

    async def get_item(self, tenant: str, conversation_id: str, item_id: str) -> Item:
        conv = self._get(tenant, conversation_id)
        seq = conv.seq_of.get(item_id)
        if seq is None:
            raise NotFound(f"item {item_id!r} not found in conversation {conversation_id!r}")
        return conv.by_seq[seq].decode()

    async def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> None:
        conv = self._get(tenant, conversation_id)
        seq = conv.seq_of.pop(item_id, None)
        if seq is None:
            raise NotFound(f"item {item_id!r} not found in conversation {conversation_id!r}")
        del conv.by_seq[seq]
        del conv.seqs[bisect.bisect_left(conv.seqs, seq)]
        self._s.wrote((("c", tenant, conversation_id), 1 + len(conv.seqs)))


def memory_stores(*, max_items: int, retention_s: float, clock: Callable[[], float] = time.monotonic) -> Stores:
    """Both stores over one shared state (put() may append to a conversation). `clock` is monotonic
    seconds, injectable so tests can age entries without sleeping."""
    state = _State(max_items=max_items, retention_s=retention_s, clock=clock)
    return Stores(MemoryResponseStore(state), MemoryConversationStore(state))
