"""The Redis backend (redis.asyncio), shared by all nodes.

Keys, all under `{prefix}:{tenant}:` (tenant and record ids cannot contain ':', see validation.py):
  seq               INCR counter; each stored response takes the next value (orders the chain walk)
  r:{id}            hash  seq, prev, doc (the record as JSON: created_at, body, output, links)
  r:{id}:in         list  input item JSON, in order          r:{id}:ix  hash item id -> list index
  c:{id}            hash  created, meta (JSON), next (next item sequence number)
  c:{id}:o          zset  item id scored by its sequence number  c:{id}:i  hash item id -> item JSON

Every write is one Lua script: it checks every precondition before its first write, so a refused write
changes nothing, and Redis runs it without interleaving other commands. All keys of an entry get the
same TTL (`retention_s`) on every write to the entry; reads never extend it. Pagination uses the list
index / zset score of the `after` item, never KEYS or SCAN. The chain walk computes key names inside
its script, so this backend needs a single Redis primary (or Sentinel), not Redis Cluster.

Durability is Redis's own: a write acknowledged by Redis survives a Redis restart only as far as the
server's appendonly/appendfsync settings promise.

No client-side retries: a lost reply could hide an applied write, and the HTTP layer wants a fast 503.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import redis.asyncio as aioredis
import redis.exceptions as rexc
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff

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
from storage.config import StorageConfig
from storage.errors import Conflict, InvalidInput, NotFound, StorageError, StorageUnavailable
from storage.keys import StoredKey

# Server replies that mean "not now" rather than "wrong request".
_TRANSIENT_REPLIES = ("READONLY", "OOM", "MASTERDOWN", "LOADING", "BUSY", "TRYAGAIN", "CLUSTERDOWN")

_PUT_RESPONSE = """
local ttl = tonumber(ARGV[1])
if redis.call('EXISTS', KEYS[1]) == 1 then return 'conflict' end
if ARGV[3] ~= '' and redis.call('EXISTS', KEYS[5]) == 0 then return 'no_prev' end
local n_in, n_out, has_conv = tonumber(ARGV[5]), tonumber(ARGV[6]), ARGV[4] == '1'
if has_conv then
  if redis.call('EXISTS', KEYS[6]) == 0 then return 'no_conv' end
  for i = 0, n_in + n_out - 1 do
    if redis.call('HEXISTS', KEYS[8], ARGV[7 + 2 * i]) == 1 then return 'item_conflict' end
  end
end
local seq = redis.call('INCR', KEYS[4])
-- Outlives every response it numbered, so the sequence never restarts below a live response.
redis.call('PEXPIRE', KEYS[4], 2 * ttl)
redis.call('HSET', KEYS[1], 'seq', seq, 'prev', ARGV[3], 'doc', ARGV[2])
redis.call('PEXPIRE', KEYS[1], ttl)
for i = 0, n_in - 1 do
  redis.call('RPUSH', KEYS[2], ARGV[8 + 2 * i])
  redis.call('HSET', KEYS[3], ARGV[7 + 2 * i], i)
end
if n_in > 0 then
  redis.call('PEXPIRE', KEYS[2], ttl)
  redis.call('PEXPIRE', KEYS[3], ttl)
end
if has_conv then
  local n = n_in + n_out
  local first = redis.call('HINCRBY', KEYS[6], 'next', n) - n
  for i = 0, n - 1 do
    redis.call('ZADD', KEYS[7], first + i, ARGV[7 + 2 * i])
    redis.call('HSET', KEYS[8], ARGV[7 + 2 * i], ARGV[8 + 2 * i])
  end
  for k = 6, 8 do redis.call('PEXPIRE', KEYS[k], ttl) end
end
return 'ok'
"""

# Deletes an entry's keys; 0 if its head key (KEYS[1]) did not exist.
_DELETE = """
if redis.call('DEL', KEYS[1]) == 0 then return 0 end
redis.call('DEL', KEYS[2], KEYS[3])
return 1
"""

# Returns {status, has_more, items in ascending index order}.
_LIST_INPUT_ITEMS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'not_found'} end
local n, limit, cursor = redis.call('LLEN', KEYS[2]), tonumber(ARGV[2]), nil
if ARGV[1] ~= '' then
  local ix = redis.call('HGET', KEYS[3], ARGV[1])
  if not ix then return {'bad_cursor'} end
  cursor = tonumber(ix)
end
local start, stop, more
if ARGV[3] == 'asc' then
  start = cursor and cursor + 1 or 0
  stop = math.min(n, start + limit)
  more = stop < n
else
  stop = cursor or n
  start = math.max(0, stop - limit)
  more = start > 0
end
if stop <= start then return {'ok', more and '1' or '0', {}} end
return {'ok', more and '1' or '0', redis.call('LRANGE', KEYS[2], start, stop - 1)}
"""

# Walks previous_response_id links (only towards strictly smaller seq: see ResponseStore.load_chain).
# Returns {'ok', {doc, {inputs}, doc, {inputs}, ...}} newest first, {'missing', id} or {'too_deep'}.
_LOAD_CHAIN = """
local base, id, max_depth = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out, child_seq, depth = {}, nil, 0
while true do
  local key = base .. ':r:' .. id
  local v = redis.call('HMGET', key, 'seq', 'prev', 'doc')
  if not v[1] or (child_seq and tonumber(v[1]) >= child_seq) then return {'missing', id} end
  depth = depth + 1
  out[#out + 1] = v[3]
  out[#out + 1] = redis.call('LRANGE', key .. ':in', 0, -1)
  if v[2] == '' then return {'ok', out} end
  if depth == max_depth then return {'too_deep'} end
  child_seq, id = tonumber(v[1]), v[2]
end
"""

_CREATE_CONVERSATION = """
local ttl, n = tonumber(ARGV[1]), tonumber(ARGV[4])
if redis.call('EXISTS', KEYS[1]) == 1 then return 'conflict' end
redis.call('HSET', KEYS[1], 'created', ARGV[2], 'meta', ARGV[3], 'next', n)
for i = 0, n - 1 do
  redis.call('ZADD', KEYS[2], i, ARGV[5 + 2 * i])
  redis.call('HSET', KEYS[3], ARGV[5 + 2 * i], ARGV[6 + 2 * i])
end
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ttl) end
return 'ok'
"""

_UPDATE_METADATA = """
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSET', KEYS[1], 'meta', ARGV[2])
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], tonumber(ARGV[1])) end
return redis.call('HGET', KEYS[1], 'created')
"""

_ADD_ITEMS = """
local ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2])
if redis.call('EXISTS', KEYS[1]) == 0 then return 'not_found' end
for i = 0, n - 1 do
  if redis.call('HEXISTS', KEYS[3], ARGV[3 + 2 * i]) == 1 then return 'item_conflict' end
end
local first = redis.call('HINCRBY', KEYS[1], 'next', n) - n
for i = 0, n - 1 do
  redis.call('ZADD', KEYS[2], first + i, ARGV[3 + 2 * i])
  redis.call('HSET', KEYS[3], ARGV[3 + 2 * i], ARGV[4 + 2 * i])
end
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], ttl) end
return 'ok'
"""

# Returns {status, has_more, item JSON in the requested order}.
_LIST_ITEMS = """
if redis.call('EXISTS', KEYS[1]) == 0 then return {'not_found'} end
local limit, bound = tonumber(ARGV[2]), nil
if ARGV[1] ~= '' then
  local score = redis.call('ZSCORE', KEYS[2], ARGV[1])
  if not score then return {'bad_cursor'} end
  bound = '(' .. score
end
local ids
if ARGV[3] == 'asc' then
  ids = redis.call('ZRANGE', KEYS[2], bound or '-inf', '+inf', 'BYSCORE', 'LIMIT', 0, limit + 1)
else
  ids = redis.call('ZRANGE', KEYS[2], bound or '+inf', '-inf', 'BYSCORE', 'REV', 'LIMIT', 0, limit + 1)
end
local more = #ids > limit
if more then table.remove(ids) end
if #ids == 0 then return {'ok', '0', {}} end
return {'ok', more and '1' or '0', redis.call('HMGET', KEYS[3], unpack(ids))}
"""

_DELETE_ITEM = """
if redis.call('EXISTS', KEYS[1]) == 0 then return 'not_found' end
if redis.call('ZREM', KEYS[2], ARGV[2]) == 0 then return 'no_item' end
redis.call('HDEL', KEYS[3], ARGV[2])
for k = 1, 3 do redis.call('PEXPIRE', KEYS[k], tonumber(ARGV[1])) end
return 'ok'
"""


async def _call(op: Awaitable[Any]) -> Any:
    """Await a Redis operation, mapping client/server failures onto the storage error tree."""
    try:
        return await op
    except (rexc.ConnectionError, rexc.TimeoutError, OSError, TimeoutError) as exc:
        raise StorageUnavailable(f"redis unavailable: {exc}") from exc
    except rexc.ResponseError as exc:
        if str(exc).startswith(_TRANSIENT_REPLIES):
            raise StorageUnavailable(f"redis refused the command: {exc}") from exc
        raise StorageError(f"redis error: {exc}") from exc
    except rexc.RedisError as exc:
        raise StorageError(f"redis error: {exc}") from exc


def _seq(value: Any) -> list[Any]:
    if not isinstance(value, list):
        raise StorageError(f"unexpected redis reply {value!r}")
    return value


def _flat_pairs(items: Sequence[Item]) -> list[str]:
    out: list[str] = []
    for item in items:
        out += (item.id, codec.dumps(item.body))
    return out


class _Keys:
    """Key names of one tenant."""

    def __init__(self, prefix: str, tenant: str) -> None:
        validation.check_tenant(tenant)
        self.base = f"{prefix}:{tenant}"
        self.seq = f"{self.base}:seq"

    def response(self, response_id: str) -> list[str]:
        validation.check_record_id("response", response_id)
        head = f"{self.base}:r:{response_id}"
        return [head, f"{head}:in", f"{head}:ix"]

    def conversation(self, conversation_id: str) -> list[str]:
        validation.check_record_id("conversation", conversation_id)
        head = f"{self.base}:c:{conversation_id}"
        return [head, f"{head}:o", f"{head}:i"]


class RedisResponseStore:
    def __init__(self, client: aioredis.Redis, prefix: str, ttl_ms: int) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_ms = ttl_ms
        self._put = client.register_script(_PUT_RESPONSE)
        self._delete = client.register_script(_DELETE)
        self._list = client.register_script(_LIST_INPUT_ITEMS)
        self._chain = client.register_script(_LOAD_CHAIN)

    async def put(self, tenant: str, response: ResponseRecord, input_items: Sequence[Item]) -> None:
        keys = _Keys(self._prefix, tenant)
        validation.check_response(response, input_items)
        prev = response.previous_response_id
        conv_id = response.conversation_id
        doc = codec.dumps(
            {
                "created_at": response.created_at,
                "previous_response_id": prev,
                "conversation_id": conv_id,
                "body": response.body,
                "output": [i.body for i in response.output],
            }
        )
        resp_keys = keys.response(response.id)
        # Unused key slots repeat the response's head key; the script never touches them.
        prev_key = keys.response(prev)[0] if prev is not None else resp_keys[0]
        conv_keys = keys.conversation(conv_id) if conv_id is not None else [resp_keys[0]] * 3
        conv_output = response.output if conv_id is not None else ()
        args: list[str | int] = [
            self._ttl_ms,
            doc,
            prev or "",
            "1" if conv_id is not None else "0",
            len(input_items),
            len(conv_output),
            *_flat_pairs(input_items),
            *_flat_pairs(conv_output),
        ]
        status = await _call(self._put(keys=[*resp_keys, keys.seq, prev_key, *conv_keys], args=args))
        if status == "conflict":
            raise Conflict(f"response {response.id!r} already exists")
        if status == "no_prev":
            raise NotFound(f"previous response {prev!r} not found")
        if status == "no_conv":
            raise NotFound(f"conversation {conv_id!r} not found")
        if status == "item_conflict":
            raise Conflict(f"an item id already exists in conversation {conv_id!r}")

    async def get(self, tenant: str, response_id: str) -> ResponseRecord:
        head = _Keys(self._prefix, tenant).response(response_id)[0]
        doc = await _call(self._client.hget(head, "doc"))
        if doc is None:
            raise NotFound(f"response {response_id!r} not found")
        return _record(response_id, doc)

    async def delete(self, tenant: str, response_id: str) -> None:
        keys = _Keys(self._prefix, tenant).response(response_id)
        if await _call(self._delete(keys=keys)) == 0:
            raise NotFound(f"response {response_id!r} not found")

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
        keys = _Keys(self._prefix, tenant).response(response_id)
        reply = _seq(await _call(self._list(keys=keys, args=[after or "", limit, order])))
        if reply[0] == "not_found":
            raise NotFound(f"response {response_id!r} not found")
        if reply[0] == "bad_cursor":
            raise InvalidInput(f"`after` item {after!r} is not an input item of {response_id!r}")
        texts = _seq(reply[2])
        if order == "desc":
            texts.reverse()
        return ItemPage(tuple(codec.item_from_text(t) for t in texts), reply[1] == "1")

    async def load_chain(
        self, tenant: str, response_id: str, *, max_depth: int = DEFAULT_MAX_CHAIN_DEPTH
    ) -> tuple[Item, ...]:
        validation.check_depth(max_depth)
        keys = _Keys(self._prefix, tenant)
        keys.response(response_id)  # validates the id
        reply = _seq(await _call(self._chain(args=[keys.base, response_id, max_depth])))
        if reply[0] == "too_deep":
            raise InvalidInput(f"previous_response_id chain is deeper than {max_depth}")
        if reply[0] == "missing":
            if reply[1] == response_id:
                raise NotFound(f"response {response_id!r} not found")
            raise NotFound(f"previous response {reply[1]!r} in the chain no longer exists")
        flat = _seq(reply[1])
        items: list[Item] = []
        # Newest first in the reply; emit oldest first.
        for i in range(len(flat) - 2, -1, -2):
            doc = codec.loads_object(flat[i])
            items += (codec.item_from_text(t) for t in _seq(flat[i + 1]))
            items += _output(doc)
        return tuple(items)


def _object(value: object) -> dict[str, object]:
    if not isinstance(value, dict):
        raise StorageError("stored record is malformed")
    return value


def _output(doc: Mapping[str, object]) -> tuple[Item, ...]:
    output = doc.get("output")
    if not isinstance(output, list):
        raise StorageError("stored record is malformed")
    return tuple(Item.from_json(_object(o)) for o in output)


def _record(response_id: str, doc_text: str) -> ResponseRecord:
    doc = codec.loads_object(doc_text)
    created_at, prev, conv = (
        doc.get("created_at"),
        doc.get("previous_response_id"),
        doc.get("conversation_id"),
    )
    if not isinstance(created_at, int) or not isinstance(prev, str | None) or not isinstance(conv, str | None):
        raise StorageError(f"stored response {response_id!r} is malformed")
    return ResponseRecord(
        id=response_id,
        created_at=created_at,
        body=_object(doc.get("body")),
        output=_output(doc),
        previous_response_id=prev,
        conversation_id=conv,
    )


class RedisConversationStore:
    def __init__(self, client: aioredis.Redis, prefix: str, ttl_ms: int) -> None:
        self._client = client
        self._prefix = prefix
        self._ttl_ms = ttl_ms
        self._create = client.register_script(_CREATE_CONVERSATION)
        self._update = client.register_script(_UPDATE_METADATA)
        self._delete = client.register_script(_DELETE)
        self._add = client.register_script(_ADD_ITEMS)
        self._list = client.register_script(_LIST_ITEMS)
        self._delete_item = client.register_script(_DELETE_ITEM)

    async def create(self, tenant: str, conversation: Conversation, items: Sequence[Item] = ()) -> Conversation:
        keys = _Keys(self._prefix, tenant).conversation(conversation.id)
        validation.check_metadata(conversation.metadata)
        validation.check_added_items(items, allow_empty=True)
        args: list[str | int] = [
            self._ttl_ms,
            conversation.created_at,
            codec.dumps(conversation.metadata),
            len(items),
            *_flat_pairs(items),
        ]
        if await _call(self._create(keys=keys, args=args)) == "conflict":
            raise Conflict(f"conversation {conversation.id!r} already exists")
        return Conversation(conversation.id, conversation.created_at, dict(conversation.metadata))

    async def get(self, tenant: str, conversation_id: str) -> Conversation:
        head = _Keys(self._prefix, tenant).conversation(conversation_id)[0]
        created, meta = _seq(await _call(self._client.hmget(head, ["created", "meta"])))
        if created is None or meta is None:
            raise NotFound(f"conversation {conversation_id!r} not found")
        return Conversation(conversation_id, int(created), codec.metadata_from_text(meta))

    async def update_metadata(self, tenant: str, conversation_id: str, metadata: Mapping[str, str]) -> Conversation:
        keys = _Keys(self._prefix, tenant).conversation(conversation_id)
        validation.check_metadata(metadata)
        created = await _call(self._update(keys=keys, args=[self._ttl_ms, codec.dumps(metadata)]))
        if created is None:
            raise NotFound(f"conversation {conversation_id!r} not found")
        return Conversation(conversation_id, int(created), dict(metadata))

    async def delete(self, tenant: str, conversation_id: str) -> None:
        keys = _Keys(self._prefix, tenant).conversation(conversation_id)
        if await _call(self._delete(keys=keys)) == 0:
            raise NotFound(f"conversation {conversation_id!r} not found")

    async def add_items(self, tenant: str, conversation_id: str, items: Sequence[Item]) -> None:
        keys = _Keys(self._prefix, tenant).conversation(conversation_id)
        validation.check_added_items(items, allow_empty=False)
        status = await _call(self._add(keys=keys, args=[self._ttl_ms, len(items), *_flat_pairs(items)]))
        if status == "not_found":
            raise NotFound(f"conversation {conversation_id!r} not found")
        if status == "item_conflict":
            raise Conflict(f"an item id already exists in conversation {conversation_id!r}")

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
        keys = _Keys(self._prefix, tenant).conversation(conversation_id)
        reply = _seq(await _call(self._list(keys=keys, args=[after or "", limit, order])))
        if reply[0] == "not_found":
            raise NotFound(f"conversation {conversation_id!r} not found")
        if reply[0] == "bad_cursor":
            raise InvalidInput(f"`after` item {after!r} is not in conversation {conversation_id!r}")
        # None only if the item hash expired a moment before the order zset (same deadline): skip it.
        texts = [t for t in _seq(reply[2]) if t is not None]
        return ItemPage(tuple(codec.item_from_text(t) for t in texts), reply[1] == "1")

    async def get_item(self, tenant: str, conversation_id: str, item_id: str) -> Item:
        head, _, items_key = _Keys(self._prefix, tenant).conversation(conversation_id)
        async with self._client.pipeline(transaction=False) as pipe:
            pipe.exists(head)
            pipe.hget(items_key, item_id)
            exists, text = _seq(await _call(pipe.execute()))
        if not exists:
            raise NotFound(f"conversation {conversation_id!r} not found")
        if text is None:
            raise NotFound(f"item {item_id!r} not found in conversation {conversation_id!r}")
        return codec.item_from_text(text)

    async def delete_item(self, tenant: str, conversation_id: str, item_id: str) -> None:
        keys = _Keys(self._prefix, tenant).conversation(conversation_id)
        status = await _call(self._delete_item(keys=keys, args=[self._ttl_ms, item_id]))
        if status == "not_found":
            raise NotFound(f"conversation {conversation_id!r} not found")
        if status == "no_item":
            raise NotFound(f"item {item_id!r} not found in conversation {conversation_id!r}")


# revoked_at of each id (storage/keys.py): set if absent or 0, else lowered; never back to 0.
_PUT_KEYS = """
for k = 1, #ARGV, 3 do
  redis.call('HSET', KEYS[1], ARGV[k], ARGV[k + 1])
  local new = tonumber(ARGV[k + 2])
  local old = tonumber(redis.call('HGET', KEYS[2], ARGV[k]) or '0')
  if new > 0 and (old == 0 or new < old) then redis.call('HSET', KEYS[2], ARGV[k], ARGV[k + 2]) end
end
return 'ok'
"""


class RedisKeyStore:
    """API keys in two hashes, id -> body and id -> revoked_at, under ``{prefix}::`` (an empty tenant segment:
    no tenant's key can collide). Without a TTL: keys are not history."""

    def __init__(self, client: aioredis.Redis, prefix: str) -> None:
        self._client = client
        self._keys = [f"{prefix}::api_keys", f"{prefix}::api_keys_revoked"]
        self._put = client.register_script(_PUT_KEYS)

    async def load_keys(self) -> list[StoredKey]:
        pipe = self._client.pipeline(transaction=True)
        pipe.hgetall(self._keys[0])
        pipe.hgetall(self._keys[1])
        bodies, revoked = _seq(await _call(pipe.execute()))
        try:
            return [StoredKey(i, codec.loads_object(b), float(revoked.get(i) or 0)) for i, b in bodies.items()]
        except (ValueError, TypeError) as exc:
            raise StorageError(f"redis: unreadable API key record: {exc}") from exc

    async def put_keys(self, keys: Sequence[StoredKey]) -> None:
        args: list[str] = []
        for key in keys:
            args += (key.key_id, codec.dumps(key.body), repr(float(key.revoked_at)))
        if args:
            await _call(self._put(keys=self._keys, args=args))


def redis_client(config: StorageConfig) -> aioredis.Redis:
    """A client that fails fast: bounded connect, command and pool-wait times, zero retries. The pool
    reconnects lazily, so after an outage the next call succeeds without rebuilding anything."""
    pool = aioredis.BlockingConnectionPool.from_url(
        config.redis_url,
        max_connections=config.redis_max_connections,
        timeout=config.connect_timeout_s,
        socket_connect_timeout=config.connect_timeout_s,
        socket_timeout=config.command_timeout_s,
        retry=Retry(NoBackoff(), 0),
        decode_responses=True,
    )
    return aioredis.Redis.from_pool(pool)


@asynccontextmanager
async def open_redis_stores(config: StorageConfig) -> AsyncIterator[Stores]:
    """Connects lazily: opening never fails because Redis is down; calls raise StorageUnavailable."""
    client = redis_client(config)
    ttl_ms = max(1, round(config.retention_s * 1000))
    try:
        yield Stores(
            RedisResponseStore(client, config.key_prefix, ttl_ms),
            RedisConversationStore(client, config.key_prefix, ttl_ms),
            RedisKeyStore(client, config.key_prefix),
        )
    finally:
        await client.aclose()
