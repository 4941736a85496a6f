"""Records and the two store Protocols behind the OpenAI Responses and Conversations APIs.

Storage treats items and response bodies as opaque JSON objects: it reads only `id` and `type` from an
item and keeps the rest verbatim. Ids and timestamps are minted by the caller (the HTTP layer), so stores
contain no clocks or id generators on the write path.

Every method takes a `tenant`; every key, row and Redis key is scoped by it, so an id that exists under
another tenant raises NotFound exactly like an id that exists nowhere.

Besides what each method lists, any of them may raise StorageContended: a backend with transactions
(Postgres) gave up retrying serialization failures or deadlocks on the same rows.

Retention (StorageConfig.retention_s) is the same in every backend: a response or a conversation, with its
items, expires `retention_s` after its last write. A response is written once (put); a conversation by
create, update_metadata, add_items, delete_item and by a put() that appends to it. Reads never extend it.
An expired entry is absent to every method at once: NotFound, a previous_response_id chain through it is
broken, and its id may be used again. Only reclaiming the space differs: memory drops expired entries on
its next call, Redis lets the keys' TTL lapse, Postgres deletes the rows in a background sweep.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol

from storage.errors import InvalidInput
from storage.keys import KeyStore

JsonObject = Mapping[str, object]
Order = Literal["asc", "desc"]

# Pagination bounds of the OpenAI list endpoints (`limit` is 1..100, default 20, default order desc).
DEFAULT_PAGE_LIMIT = 20
MAX_PAGE_LIMIT = 100
# The Conversations API accepts at most 20 items per create / add-items call.
MAX_ITEMS_PER_ADD = 20
# OpenAI metadata: at most 16 pairs, keys up to 64 chars, values up to 512 chars.
MAX_METADATA_PAIRS = 16
MAX_METADATA_KEY_CHARS = 64
MAX_METADATA_VALUE_CHARS = 512
# One put is one transaction / Lua call; bound its size so a single request cannot stall the backend.
MAX_ITEMS_PER_RESPONSE = 10_000
# Default bound on previous_response_id hops loaded for one request (each hop is usually one turn
# or one tool round trip of an agent loop).
DEFAULT_MAX_CHAIN_DEPTH = 1024


@dataclass(frozen=True, slots=True)
class Item:
    """One conversation or response item (message, function_call, reasoning, ...).

    Invariant: `body["id"] == id` and `body["type"] == type`; the body is stored and returned verbatim.
    """

    id: str
    type: str
    body: JsonObject

    def __post_init__(self) -> None:
        if self.body.get("id") != self.id or self.body.get("type") != self.type:
            raise InvalidInput(f"item {self.id!r}: body id/type disagree with the record")

    @classmethod
    def from_json(cls, body: JsonObject) -> Item:
        """Wrap a JSON item object. Raises InvalidInput if `id` or `type` is missing or not a string."""
        item_id = body.get("id")
        item_type = body.get("type")
        if not isinstance(item_id, str) or not isinstance(item_type, str):
            raise InvalidInput("an item needs string `id` and `type` fields")
        return cls(item_id, item_type, body)


@dataclass(frozen=True, slots=True)
class ResponseRecord:
    """A stored response.

    `body` is the response object without `output` (status, model, usage, instructions, metadata, ...);
    the output items are kept as `output` so a previous_response_id chain can be replayed from them.
    `created_at` is unix seconds, as in the API object.
    """

    id: str
    created_at: int
    body: JsonObject
    output: tuple[Item, ...] = ()
    previous_response_id: str | None = None
    # When set, put() appends the input then output items to this conversation in the same transaction.
    conversation_id: str | None = None


@dataclass(frozen=True, slots=True)
class Conversation:
    """A conversation's header; its items live in the store. `created_at` is unix seconds."""

    id: str
    created_at: int
    metadata: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ItemPage:
    """One page of a cursor-paginated list, already in the requested order."""

    items: tuple[Item, ...]
    has_more: bool

    @property
    def first_id(self) -> str | None:
        return self.items[0].id if self.items else None

    @property
    def last_id(self) -> str | None:
        return self.items[-1].id if self.items else None


class ResponseStore(Protocol):
    async def put(self, tenant: str, response: ResponseRecord, input_items: Sequence[Item]) -> None:
        """Store a response with its input and output items atomically; durable once it returns.

        The previous response (if any) must already exist for this tenant. Raises Conflict if the id exists
        (or, with conversation_id set, an item id already exists in that conversation), NotFound if the
        previous response or the conversation does not, InvalidInput, StorageUnavailable.
        """
        ...

    async def get(self, tenant: str, response_id: str) -> ResponseRecord:
        """Raises NotFound, InvalidInput, StorageUnavailable."""
        ...

    async def delete(self, tenant: str, response_id: str) -> None:
        """Delete the response and its input items. Raises NotFound, InvalidInput, StorageUnavailable."""
        ...

    async def list_input_items(
        self,
        tenant: str,
        response_id: str,
        *,
        after: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        order: Order = "desc",
    ) -> ItemPage:
        """Page through a response's input items; `after` is the id of the last item already seen.

        Raises NotFound (response), InvalidInput (limit, or an `after` id not in this list),
        StorageUnavailable.
        """
        ...

    async def load_chain(
        self, tenant: str, response_id: str, *, max_depth: int = DEFAULT_MAX_CHAIN_DEPTH
    ) -> tuple[Item, ...]:
        """The conversation state that `previous_response_id=response_id` continues from.

        Walks previous_response_id links from `response_id` back to the root and returns, oldest response
        first, each response's input items followed by its output items.

        Acyclicity: put() requires the previous response to exist, and every stored response gets a
        sequence number larger than all before it, so a link always points to a strictly smaller
        sequence number. Walks only follow links to strictly smaller numbers: if an ancestor was deleted
        and its id reused, the new holder has a larger number and the link counts as broken. The walk
        therefore terminates without cycle detection; max_depth additionally bounds its cost.

        Raises NotFound (the response, or a deleted/expired ancestor, named in the message), InvalidInput
        (the chain is deeper than max_depth), StorageUnavailable.
        """
        ...


class ConversationStore(Protocol):
    async def create(self, tenant: str, conversation: Conversation, items: Sequence[Item] = ()) -> Conversation:
        """Create a conversation with up to MAX_ITEMS_PER_ADD initial items, atomically.

        Raises Conflict (id exists), InvalidInput, StorageUnavailable.
        """
        ...

    async def get(self, tenant: str, conversation_id: str) -> Conversation:
        """Raises NotFound, InvalidInput, StorageUnavailable."""
        ...

    async def update_metadata(self, tenant: str, conversation_id: str, metadata: Mapping[str, str]) -> Conversation:
        """Replace the metadata. Raises NotFound, InvalidInput, StorageUnavailable."""
        ...

    async def delete(self, tenant: str, conversation_id: str) -> None:
        """Delete the conversation and all its items. Raises NotFound, InvalidInput, StorageUnavailable."""
        ...

    async def add_items(self, tenant: str, conversation_id: str, items: Sequence[Item]) -> None:
        """Append 1..MAX_ITEMS_PER_ADD items atomically: all are added or none.

        Raises NotFound, Conflict (an item id already in the conversation), InvalidInput,
        StorageUnavailable.
        """
        ...

    async def list_items(
        self,
        tenant: str,
        conversation_id: str,
        *,
        after: str | None = None,
        limit: int = DEFAULT_PAGE_LIMIT,
        order: Order = "desc",
    ) -> ItemPage:
        """Page through items in insertion order (or its reverse).

        Raises NotFound, InvalidInput (limit, or an `after` id not in the conversation), StorageUnavailable.
        """
        ...

    async def get_item(self, tenant: str, conversation_id: str, item_id: str) -> Item:
        """Raises NotFound (conversation or item), InvalidInput, StorageUnavailable."""
        ...

    async def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> None:
        """Raises NotFound (conversation or item), InvalidInput, StorageUnavailable."""
        ...


@dataclass(frozen=True, slots=True)
class Stores:
    """What open_stores() yields: both stores over one backend, and the API keys' durable copy on a shared
    backend (None for memory: a node's own history is no place for cluster keys; see --keys-file)."""

    responses: ResponseStore
    conversations: ConversationStore
    keys: KeyStore | None = None
