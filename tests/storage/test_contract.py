"""The one behavioural contract of ResponseStore and ConversationStore, run against every backend
(memory, and real Redis and Postgres), retention included. Backend-specific behaviour (eviction, key TTLs,
the Postgres sweeper, migrations, outages) lives in the per-backend test modules."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence

import pytest

from storage import (
    Conflict,
    Conversation,
    InvalidInput,
    Item,
    ItemPage,
    NotFound,
    Order,
    ResponseRecord,
    Stores,
)
from tests.storage.conftest import Aging

CREATED_AT = 1_700_000_000


def msg(item_id: str, text: str = "hi", role: str = "user") -> Item:
    return Item.from_json(
        {"id": item_id, "type": "message", "role": role, "content": [{"type": "input_text", "text": text}]}
    )


def call(item_id: str) -> Item:
    return Item.from_json(
        {"id": item_id, "type": "function_call", "call_id": f"call_{item_id}", "name": "f", "arguments": "{}"}
    )


def response(
    rid: str, *, prev: str | None = None, conv: str | None = None, output: Sequence[Item] = ()
) -> ResponseRecord:
    body = {
        "id": rid,
        "object": "response",
        "status": "completed",
        "model": "m",
        "instructions": None,
        "metadata": {"k": "v"},
        "usage": {"input_tokens": 3, "output_tokens": 5, "total_tokens": 8},
    }
    return ResponseRecord(rid, CREATED_AT, body, tuple(output), prev, conv)


Fetch = Callable[..., Awaitable[ItemPage]]


async def walk(fetch: Fetch, order: Order, limit: int) -> list[str]:
    """Follow `after` cursors through every page; checks page sizes and first/last ids on the way."""
    ids: list[str] = []
    after: str | None = None
    while True:
        page = await fetch(after=after, limit=limit, order=order)
        assert len(page.items) <= limit
        assert not page.has_more or len(page.items) == limit
        if page.items:
            assert page.first_id == page.items[0].id and page.last_id == page.items[-1].id
        ids += [i.id for i in page.items]
        if not page.has_more:
            return ids
        after = page.last_id


# ---- responses -------------------------------------------------------------------------------------


async def test_put_get_roundtrip(stores: Stores, tenant: str) -> None:
    rec = response("resp_1", output=[msg("msg_out", "hello", "assistant"), call("fc_1")])
    await stores.responses.put(tenant, rec, [msg("msg_in")])
    got = await stores.responses.get(tenant, "resp_1")
    assert got == rec
    assert got.output[1].body["call_id"] == "call_fc_1"


async def test_put_existing_id_conflicts_and_keeps_first(stores: Stores, tenant: str) -> None:
    await stores.responses.put(tenant, response("resp_1"), [msg("a")])
    with pytest.raises(Conflict):
        await stores.responses.put(tenant, response("resp_1", output=[msg("x")]), [msg("b")])
    page = await stores.responses.list_input_items(tenant, "resp_1")
    assert [i.id for i in page.items] == ["a"]
    assert (await stores.responses.get(tenant, "resp_1")).output == ()


async def test_put_requires_existing_previous(stores: Stores, tenant: str) -> None:
    with pytest.raises(NotFound):
        await stores.responses.put(tenant, response("resp_2", prev="resp_missing"), [msg("a")])
    with pytest.raises(NotFound):
        await stores.responses.get(tenant, "resp_2")


async def test_get_delete_missing(stores: Stores, tenant: str) -> None:
    with pytest.raises(NotFound):
        await stores.responses.get(tenant, "resp_nope")
    with pytest.raises(NotFound):
        await stores.responses.delete(tenant, "resp_nope")
    with pytest.raises(NotFound):
        await stores.responses.list_input_items(tenant, "resp_nope")
    with pytest.raises(NotFound):
        await stores.responses.load_chain(tenant, "resp_nope")


async def test_delete_removes_response_and_inputs(stores: Stores, tenant: str) -> None:
    await stores.responses.put(tenant, response("resp_1"), [msg("a"), msg("b")])
    await stores.responses.delete(tenant, "resp_1")
    with pytest.raises(NotFound):
        await stores.responses.get(tenant, "resp_1")
    with pytest.raises(NotFound):
        await stores.responses.list_input_items(tenant, "resp_1")
    # The id is free again and starts with no stale items.
    await stores.responses.put(tenant, response("resp_1"), [msg("c")])
    assert [i.id for i in (await stores.responses.list_input_items(tenant, "resp_1")).items] == ["c"]


async def test_response_without_input_items(stores: Stores, tenant: str) -> None:
    await stores.responses.put(tenant, response("resp_1", output=[msg("o")]), [])
    page = await stores.responses.list_input_items(tenant, "resp_1")
    assert page.items == () and not page.has_more and page.first_id is None
    assert [i.id for i in await stores.responses.load_chain(tenant, "resp_1")] == ["o"]


@pytest.mark.parametrize("limit", [1, 3, 10, 100])
async def test_list_input_items_pagination(stores: Stores, tenant: str, limit: int) -> None:
    ids = [f"msg_{i:02d}" for i in range(10)]
    await stores.responses.put(tenant, response("resp_1"), [msg(i) for i in ids])

    async def fetch(**kw: object) -> ItemPage:
        return await stores.responses.list_input_items(tenant, "resp_1", **kw)  # type: ignore[arg-type]

    assert await walk(fetch, "asc", limit) == ids
    assert await walk(fetch, "desc", limit) == ids[::-1]


async def test_list_input_items_defaults_and_bounds(stores: Stores, tenant: str) -> None:
    ids = [f"msg_{i:02d}" for i in range(25)]
    await stores.responses.put(tenant, response("resp_1"), [msg(i) for i in ids])
    page = await stores.responses.list_input_items(tenant, "resp_1")
    assert [i.id for i in page.items] == ids[::-1][:20] and page.has_more  # default: desc, 20
    page = await stores.responses.list_input_items(tenant, "resp_1", after="msg_05", limit=2, order="desc")
    assert [i.id for i in page.items] == ["msg_04", "msg_03"] and page.has_more
    page = await stores.responses.list_input_items(tenant, "resp_1", after="msg_01", limit=5, order="desc")
    assert [i.id for i in page.items] == ["msg_00"] and not page.has_more
    page = await stores.responses.list_input_items(tenant, "resp_1", after="msg_24", order="asc")
    assert page.items == () and not page.has_more
    for bad in (0, 101, -1):
        with pytest.raises(InvalidInput):
            await stores.responses.list_input_items(tenant, "resp_1", limit=bad)
    with pytest.raises(InvalidInput):
        await stores.responses.list_input_items(tenant, "resp_1", after="msg_unknown")


async def test_load_chain_orders_items_oldest_first(stores: Stores, tenant: str) -> None:
    r = stores.responses
    await r.put(tenant, response("resp_1", output=[msg("o1", role="assistant")]), [msg("i1")])
    await r.put(tenant, response("resp_2", prev="resp_1", output=[call("fc_2")]), [msg("i2a"), msg("i2b")])
    await r.put(tenant, response("resp_3", prev="resp_2", output=[msg("o3")]), [msg("i3")])
    assert [i.id for i in await r.load_chain(tenant, "resp_3")] == [
        "i1",
        "o1",
        "i2a",
        "i2b",
        "fc_2",
        "i3",
        "o3",
    ]
    assert [i.id for i in await r.load_chain(tenant, "resp_2")] == ["i1", "o1", "i2a", "i2b", "fc_2"]
    chain = await r.load_chain(tenant, "resp_3", max_depth=3)
    assert chain[4].body["name"] == "f"
    with pytest.raises(InvalidInput):
        await r.load_chain(tenant, "resp_3", max_depth=2)
    with pytest.raises(InvalidInput):
        await r.load_chain(tenant, "resp_3", max_depth=0)


async def test_load_chain_with_deleted_ancestor_is_not_found(stores: Stores, tenant: str) -> None:
    r = stores.responses
    await r.put(tenant, response("resp_1"), [msg("i1")])
    await r.put(tenant, response("resp_2", prev="resp_1"), [msg("i2")])
    await r.put(tenant, response("resp_3", prev="resp_2"), [msg("i3")])
    await r.delete(tenant, "resp_2")
    with pytest.raises(NotFound, match="resp_2"):
        await r.load_chain(tenant, "resp_3")


async def test_reused_id_cannot_close_a_cycle(stores: Stores, tenant: str) -> None:
    """A <- B, delete A, put a new A with previous B: the stored links now read A -> B -> A, but B's link
    points to a newer response and counts as broken, so the walk stops instead of looping."""
    r = stores.responses
    await r.put(tenant, response("resp_a"), [msg("a1")])
    await r.put(tenant, response("resp_b", prev="resp_a"), [msg("b1")])
    await r.delete(tenant, "resp_a")
    await r.put(tenant, response("resp_a", prev="resp_b"), [msg("a2")])
    with pytest.raises(NotFound, match="resp_a"):
        await r.load_chain(tenant, "resp_a")
    with pytest.raises(NotFound, match="resp_a"):
        await r.load_chain(tenant, "resp_b")


async def test_put_appends_to_conversation_atomically(stores: Stores, tenant: str) -> None:
    c, r = stores.conversations, stores.responses
    await c.create(tenant, Conversation("conv_1", CREATED_AT), [msg("sys", role="system")])
    await r.put(tenant, response("resp_1", conv="conv_1", output=[msg("o1")]), [msg("i1")])
    await r.put(tenant, response("resp_2", conv="conv_1", output=[call("fc_2")]), [msg("i2")])
    page = await c.list_items(tenant, "conv_1", order="asc")
    assert [i.id for i in page.items] == ["sys", "i1", "o1", "i2", "fc_2"]
    assert (await r.get(tenant, "resp_2")).conversation_id == "conv_1"
    # Missing conversation: nothing is stored.
    with pytest.raises(NotFound):
        await r.put(tenant, response("resp_3", conv="conv_missing"), [msg("i3")])
    with pytest.raises(NotFound):
        await r.get(tenant, "resp_3")
    # An item id already in the conversation: neither the response nor any item is stored.
    with pytest.raises(Conflict):
        await r.put(tenant, response("resp_4", conv="conv_1", output=[msg("o4")]), [msg("i4"), msg("i1")])
    with pytest.raises(NotFound):
        await r.get(tenant, "resp_4")
    assert len((await c.list_items(tenant, "conv_1")).items) == 5
    # Input and output sharing an id cannot both join one conversation.
    with pytest.raises(InvalidInput):
        await r.put(tenant, response("resp_5", conv="conv_1", output=[msg("dup")]), [msg("dup")])


async def test_output_may_repeat_an_input_id_without_conversation(stores: Stores, tenant: str) -> None:
    """Clients resend earlier output items (same ids) as input; that must be storable."""
    await stores.responses.put(tenant, response("resp_1", output=[msg("m")]), [msg("m")])
    assert [i.id for i in await stores.responses.load_chain(tenant, "resp_1")] == ["m", "m"]


async def test_concurrent_puts_of_one_id_store_exactly_one(stores: Stores, tenant: str) -> None:
    results = await asyncio.gather(
        *(stores.responses.put(tenant, response("resp_x"), [msg(f"i{n}")]) for n in range(8)),
        return_exceptions=True,
    )
    assert sum(r is None for r in results) == 1
    assert all(isinstance(r, Conflict) for r in results if r is not None)
    assert len((await stores.responses.list_input_items(tenant, "resp_x")).items) == 1


# ---- conversations ---------------------------------------------------------------------------------


async def test_conversation_lifecycle(stores: Stores, tenant: str) -> None:
    c = stores.conversations
    created = await c.create(tenant, Conversation("conv_1", CREATED_AT, {"topic": "demo"}))
    assert created == Conversation("conv_1", CREATED_AT, {"topic": "demo"})
    assert await c.get(tenant, "conv_1") == created
    with pytest.raises(Conflict):
        await c.create(tenant, Conversation("conv_1", CREATED_AT))
    updated = await c.update_metadata(tenant, "conv_1", {"a": "1", "b": "2"})
    assert updated.metadata == {"a": "1", "b": "2"} and updated.created_at == CREATED_AT
    assert await c.get(tenant, "conv_1") == updated
    await c.delete(tenant, "conv_1")
    for op in (c.get(tenant, "conv_1"), c.delete(tenant, "conv_1"), c.update_metadata(tenant, "conv_1", {})):
        with pytest.raises(NotFound):
            await op


async def test_metadata_bounds(stores: Stores, tenant: str) -> None:
    c = stores.conversations
    ok = {f"k{i}": "v" * 512 for i in range(16)}
    await c.create(tenant, Conversation("conv_1", CREATED_AT, ok))
    assert (await c.get(tenant, "conv_1")).metadata == ok
    for bad in ({f"k{i}": "v" for i in range(17)}, {"k" * 65: "v"}, {"k": "v" * 513}, {"": "v"}):
        with pytest.raises(InvalidInput):
            await c.update_metadata(tenant, "conv_1", bad)
        with pytest.raises(InvalidInput):
            await c.create(tenant, Conversation("conv_2", CREATED_AT, bad))
    assert (await c.get(tenant, "conv_1")).metadata == ok


@pytest.mark.parametrize("limit", [1, 4, 100])
async def test_list_items_pagination_after_adds_and_deletes(stores: Stores, tenant: str, limit: int) -> None:
    c = stores.conversations
    await c.create(tenant, Conversation("conv_1", CREATED_AT), [msg(f"m{i:02d}") for i in range(5)])
    await c.add_items(tenant, "conv_1", [msg(f"m{i:02d}") for i in range(5, 20)])
    await c.add_items(tenant, "conv_1", [call("fc_20")])
    await c.delete_item(tenant, "conv_1", "m03")
    await c.delete_item(tenant, "conv_1", "fc_20")
    expected = [f"m{i:02d}" for i in range(20) if i != 3]

    async def fetch(**kw: object) -> ItemPage:
        return await c.list_items(tenant, "conv_1", **kw)  # type: ignore[arg-type]

    assert await walk(fetch, "asc", limit) == expected
    assert await walk(fetch, "desc", limit) == expected[::-1]
    default = await c.list_items(tenant, "conv_1")
    assert [i.id for i in default.items] == expected[::-1][:20] and not default.has_more


async def test_list_items_bounds(stores: Stores, tenant: str) -> None:
    c = stores.conversations
    await c.create(tenant, Conversation("conv_1", CREATED_AT), [msg("a"), msg("b")])
    with pytest.raises(InvalidInput):
        await c.list_items(tenant, "conv_1", limit=0)
    with pytest.raises(InvalidInput):
        await c.list_items(tenant, "conv_1", limit=101)
    with pytest.raises(InvalidInput):
        await c.list_items(tenant, "conv_1", after="zzz")
    await c.delete_item(tenant, "conv_1", "a")
    with pytest.raises(InvalidInput):  # a cursor at a deleted item is gone
        await c.list_items(tenant, "conv_1", after="a")
    with pytest.raises(NotFound):
        await c.list_items(tenant, "conv_missing")
    await c.create(tenant, Conversation("conv_2", CREATED_AT))
    page = await c.list_items(tenant, "conv_2")
    assert page.items == () and not page.has_more


async def test_add_items_is_atomic(stores: Stores, tenant: str) -> None:
    c = stores.conversations
    await c.create(tenant, Conversation("conv_1", CREATED_AT), [msg("a")])
    with pytest.raises(Conflict):
        await c.add_items(tenant, "conv_1", [msg("b"), msg("c"), msg("a")])
    with pytest.raises(InvalidInput):
        await c.add_items(tenant, "conv_1", [msg("d"), msg("d")])
    with pytest.raises(InvalidInput):
        await c.add_items(tenant, "conv_1", [msg(f"x{i}") for i in range(21)])
    with pytest.raises(InvalidInput):
        await c.add_items(tenant, "conv_1", [])
    with pytest.raises(NotFound):
        await c.add_items(tenant, "conv_missing", [msg("e")])
    assert [i.id for i in (await c.list_items(tenant, "conv_1")).items] == ["a"]
    await c.add_items(tenant, "conv_1", [msg(f"x{i}") for i in range(20)])
    assert len((await c.list_items(tenant, "conv_1", limit=100)).items) == 21


async def test_create_with_too_many_items_creates_nothing(stores: Stores, tenant: str) -> None:
    c = stores.conversations
    with pytest.raises(InvalidInput):
        await c.create(tenant, Conversation("conv_1", CREATED_AT), [msg(f"x{i}") for i in range(21)])
    with pytest.raises(NotFound):
        await c.get(tenant, "conv_1")


async def test_get_and_delete_item(stores: Stores, tenant: str) -> None:
    c = stores.conversations
    await c.create(tenant, Conversation("conv_1", CREATED_AT), [msg("a", "alpha"), call("fc_1")])
    assert (await c.get_item(tenant, "conv_1", "a")).body["content"] == [{"type": "input_text", "text": "alpha"}]
    assert (await c.get_item(tenant, "conv_1", "fc_1")).type == "function_call"
    await c.delete_item(tenant, "conv_1", "a")
    with pytest.raises(NotFound, match="item"):
        await c.get_item(tenant, "conv_1", "a")
    with pytest.raises(NotFound, match="item"):
        await c.delete_item(tenant, "conv_1", "a")
    with pytest.raises(NotFound, match="conversation"):
        await c.get_item(tenant, "conv_missing", "fc_1")
    with pytest.raises(NotFound, match="conversation"):
        await c.delete_item(tenant, "conv_missing", "fc_1")
    # A deleted item's id may be added again; it goes to the end.
    await c.add_items(tenant, "conv_1", [msg("a", "again")])
    assert [i.id for i in (await c.list_items(tenant, "conv_1", order="asc")).items] == ["fc_1", "a"]


async def test_delete_conversation_deletes_items(stores: Stores, tenant: str) -> None:
    c = stores.conversations
    await c.create(tenant, Conversation("conv_1", CREATED_AT), [msg("a"), msg("b")])
    await c.delete(tenant, "conv_1")
    with pytest.raises(NotFound):
        await c.get_item(tenant, "conv_1", "a")
    with pytest.raises(NotFound):
        await c.list_items(tenant, "conv_1")
    await c.create(tenant, Conversation("conv_1", CREATED_AT))
    assert (await c.list_items(tenant, "conv_1")).items == ()
    with pytest.raises(NotFound):
        await c.get_item(tenant, "conv_1", "a")


async def test_concurrent_appends_keep_every_item_once(stores: Stores, tenant: str) -> None:
    c = stores.conversations
    await c.create(tenant, Conversation("conv_1", CREATED_AT))
    await asyncio.gather(*(c.add_items(tenant, "conv_1", [msg(f"b{b}_{i}") for i in range(5)]) for b in range(12)))

    async def fetch(**kw: object) -> ItemPage:
        return await c.list_items(tenant, "conv_1", **kw)  # type: ignore[arg-type]

    ids = await walk(fetch, "asc", 7)
    assert sorted(ids) == sorted(f"b{b}_{i}" for b in range(12) for i in range(5))
    # Each batch is contiguous and in order: appends do not interleave.
    for b in range(12):
        start = ids.index(f"b{b}_0")
        assert ids[start : start + 5] == [f"b{b}_{i}" for i in range(5)]


# ---- isolation and input validation ----------------------------------------------------------------


async def test_tenants_are_isolated(stores: Stores, tenant: str) -> None:
    other = f"{tenant}-other"
    r, c = stores.responses, stores.conversations
    await r.put(tenant, response("resp_1"), [msg("a")])
    await c.create(tenant, Conversation("conv_1", CREATED_AT), [msg("a")])
    for op in (
        r.get(other, "resp_1"),
        r.delete(other, "resp_1"),
        r.list_input_items(other, "resp_1"),
        r.load_chain(other, "resp_1"),
        r.put(other, response("resp_2", prev="resp_1"), []),
        r.put(other, response("resp_3", conv="conv_1"), []),
        c.get(other, "conv_1"),
        c.update_metadata(other, "conv_1", {"x": "y"}),
        c.delete(other, "conv_1"),
        c.add_items(other, "conv_1", [msg("b")]),
        c.list_items(other, "conv_1"),
        c.get_item(other, "conv_1", "a"),
        c.delete_item(other, "conv_1", "a"),
    ):
        with pytest.raises(NotFound):
            await op
    # The same ids can exist independently under another tenant.
    await r.put(other, response("resp_1", output=[msg("o")]), [msg("z")])
    await c.create(other, Conversation("conv_1", CREATED_AT, {"t": "other"}))
    assert [i.id for i in await r.load_chain(tenant, "resp_1")] == ["a"]
    assert (await c.get(tenant, "conv_1")).metadata == {}
    assert [i.id for i in (await c.list_items(tenant, "conv_1")).items] == ["a"]


@pytest.mark.parametrize("bad_tenant", ["", "a:b", "with space", "x" * 257, "tab\there"])
async def test_bad_tenant_is_invalid(stores: Stores, bad_tenant: str) -> None:
    with pytest.raises(InvalidInput):
        await stores.responses.get(bad_tenant, "resp_1")
    with pytest.raises(InvalidInput):
        await stores.conversations.create(bad_tenant, Conversation("conv_1", CREATED_AT))


async def test_bad_ids_and_bodies_are_invalid(stores: Stores, tenant: str) -> None:
    r, c = stores.responses, stores.conversations
    for bad_id in ("", "resp:1", "resp 1", "r" * 129):
        with pytest.raises(InvalidInput):
            await r.put(tenant, response(bad_id), [])
        with pytest.raises(InvalidInput):
            await c.get(tenant, bad_id)
    with pytest.raises(InvalidInput):
        await r.put(tenant, response("resp_1", prev="bad:id"), [])
    with pytest.raises(InvalidInput):
        await r.put(tenant, response("resp_1"), [Item.from_json({"id": "a", "type": "message", "x": object()})])
    with pytest.raises(InvalidInput):
        Item.from_json({"type": "message"})
    with pytest.raises(InvalidInput):
        Item("a", "message", {"id": "b", "type": "message"})
    with pytest.raises(InvalidInput):
        await r.put(tenant, response("resp_1"), [msg("a"), msg("a")])
    with pytest.raises(NotFound):
        await r.get(tenant, "resp_1")


# ---- retention -------------------------------------------------------------------------------------
# Time moves in fractions of the retention, so one test runs on the fake clocks and on Redis' real one. An
# entry written EARLY ago must still be there (1 - EARLY of the retention is the slack for a slow machine);
# one last written EARLY + LATE ago must be gone.
EARLY, LATE = 0.5, 0.6


async def test_response_expires_after_retention_since_its_write(aging: Aging, tenant: str) -> None:
    r = aging.stores.responses
    await r.put(tenant, response("resp_1", output=[msg("o1")]), [msg("i1")])
    await aging.advance(EARLY * aging.retention_s)
    assert (await r.get(tenant, "resp_1")).id == "resp_1"  # reads do not extend the retention,
    assert len((await r.list_input_items(tenant, "resp_1")).items) == 1
    await r.put(tenant, response("resp_2", prev="resp_1"), [msg("i2")])  # nor does a child's write
    await aging.advance(LATE * aging.retention_s)
    for op in (
        r.get(tenant, "resp_1"),
        r.list_input_items(tenant, "resp_1"),
        r.load_chain(tenant, "resp_1"),
        r.delete(tenant, "resp_1"),
        r.put(tenant, response("resp_3", prev="resp_1"), [msg("i3")]),
    ):
        with pytest.raises(NotFound):
            await op
    # A chain through the expired ancestor is broken, as if the ancestor had been deleted.
    assert (await r.get(tenant, "resp_2")).previous_response_id == "resp_1"
    with pytest.raises(NotFound, match="resp_1"):
        await r.load_chain(tenant, "resp_2")
    await r.put(tenant, response("resp_3", prev="resp_2"), [msg("i3")])
    with pytest.raises(NotFound, match="resp_1"):
        await r.load_chain(tenant, "resp_3")
    # The expired id is free again. Its new holder is newer than resp_2, so resp_2's link stays broken.
    await r.put(tenant, response("resp_1", output=[msg("o1b")]), [msg("i1b")])
    assert [i.id for i in await r.load_chain(tenant, "resp_1")] == ["i1b", "o1b"]
    with pytest.raises(NotFound, match="resp_1"):
        await r.load_chain(tenant, "resp_2")


async def test_conversation_expires_after_retention_since_its_last_write(aging: Aging, tenant: str) -> None:
    c, r = aging.stores.conversations, aging.stores.responses
    for cid in ("conv_idle", "conv_read", "conv_add", "conv_meta", "conv_resp", "conv_del"):
        await c.create(tenant, Conversation(cid, CREATED_AT), [msg("a"), msg("b")])
    await aging.advance(EARLY * aging.retention_s)
    # Reads do not extend the retention; every kind of write does.
    await c.get(tenant, "conv_read")
    await c.list_items(tenant, "conv_read")
    await c.get_item(tenant, "conv_read", "a")
    await c.add_items(tenant, "conv_add", [msg("c")])
    await c.update_metadata(tenant, "conv_meta", {"k": "v"})
    await r.put(tenant, response("resp_1", conv="conv_resp", output=[msg("o")]), [msg("i")])
    await c.delete_item(tenant, "conv_del", "a")
    await aging.advance(LATE * aging.retention_s)
    for cid in ("conv_idle", "conv_read"):
        for op in (
            c.get(tenant, cid),
            c.list_items(tenant, cid),
            c.get_item(tenant, cid, "a"),
            c.add_items(tenant, cid, [msg("z")]),
            c.update_metadata(tenant, cid, {"k": "v"}),
            c.delete_item(tenant, cid, "b"),
            c.delete(tenant, cid),
            r.put(tenant, response(f"resp_{cid}", conv=cid), [msg("z")]),
            r.get(tenant, f"resp_{cid}"),
        ):
            with pytest.raises(NotFound):
                await op

    async def ids(cid: str) -> list[str]:
        return [i.id for i in (await c.list_items(tenant, cid, order="asc")).items]

    assert await ids("conv_add") == ["a", "b", "c"]
    assert await ids("conv_meta") == ["a", "b"]
    assert (await c.get(tenant, "conv_meta")).metadata == {"k": "v"}
    assert await ids("conv_resp") == ["a", "b", "i", "o"]
    assert await ids("conv_del") == ["b"]
    # An expired id is free again, without a trace of its old items.
    await c.create(tenant, Conversation("conv_idle", CREATED_AT, {"new": "1"}))
    assert await ids("conv_idle") == []
    with pytest.raises(NotFound, match="item"):
        await c.get_item(tenant, "conv_idle", "a")
