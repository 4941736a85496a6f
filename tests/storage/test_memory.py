"""Memory backend specifics: age-based retention and LRU eviction (driven by an injected clock), and the
pagination window arithmetic."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from storage import Conversation, InvalidInput, Item, NotFound, ResponseRecord, Stores
from storage.memory import memory_stores, page_window

TENANT = "t"


class FakeClock:
    def __init__(self) -> None:
        self.now_s = 1000.0

    def __call__(self) -> float:
        return self.now_s


def msg(item_id: str) -> Item:
    return Item.from_json({"id": item_id, "type": "message", "role": "user", "content": "x"})


def resp(rid: str, n_inputs: int = 0, conv: str | None = None) -> tuple[ResponseRecord, list[Item]]:
    return ResponseRecord(rid, 0, {"id": rid}, conversation_id=conv), [msg(f"{rid}_{i}") for i in range(n_inputs)]


async def exists(stores: Stores, rid: str) -> bool:
    try:
        await stores.responses.get(TENANT, rid)
    except NotFound:
        return False
    return True


async def test_entries_expire_after_retention_since_last_write() -> None:
    clock = FakeClock()
    s = memory_stores(max_items=100, retention_s=60, clock=clock)
    await s.responses.put(TENANT, *resp("resp_1"))
    await s.conversations.create(TENANT, Conversation("conv_1", 0))
    clock.now_s += 50
    assert await exists(s, "resp_1")  # reads do not extend the retention...
    await s.conversations.add_items(TENANT, "conv_1", [msg("a")])  # ...writes do
    clock.now_s += 11
    assert not await exists(s, "resp_1")
    assert [i.id for i in (await s.conversations.list_items(TENANT, "conv_1")).items] == ["a"]
    clock.now_s += 50
    with pytest.raises(NotFound):
        await s.conversations.get(TENANT, "conv_1")


async def test_least_recently_used_entry_is_evicted_whole() -> None:
    s = memory_stores(max_items=10, retention_s=3600, clock=FakeClock())
    for rid in ("resp_a", "resp_b", "resp_c"):
        await s.responses.put(TENANT, *resp(rid, n_inputs=2))  # 3 items each: 9 of 10
    await s.responses.get(TENANT, "resp_a")  # now resp_b is least recently used
    await s.responses.put(TENANT, *resp("resp_d", n_inputs=2))
    assert [await exists(s, r) for r in ("resp_a", "resp_b", "resp_c", "resp_d")] == [True, False, True, True]
    # Deleting frees capacity: two more 1-item responses fit without evicting anything.
    await s.responses.delete(TENANT, "resp_c")
    await s.responses.put(TENANT, *resp("resp_e"))
    await s.responses.put(TENANT, *resp("resp_f"))
    assert all([await exists(s, r) for r in ("resp_a", "resp_d", "resp_e", "resp_f")])


async def test_write_larger_than_capacity_is_refused_without_side_effects() -> None:
    s = memory_stores(max_items=5, retention_s=3600, clock=FakeClock())
    await s.responses.put(TENANT, *resp("resp_a"))
    with pytest.raises(InvalidInput):
        await s.responses.put(TENANT, *resp("resp_big", n_inputs=5))
    assert await exists(s, "resp_a")
    await s.conversations.create(TENANT, Conversation("conv_1", 0), [msg("a"), msg("b")])
    with pytest.raises(InvalidInput):
        await s.conversations.add_items(TENANT, "conv_1", [msg("c"), msg("d"), msg("e")])
    assert len((await s.conversations.list_items(TENANT, "conv_1")).items) == 2


async def test_put_into_conversation_never_evicts_that_conversation() -> None:
    s = memory_stores(max_items=7, retention_s=3600, clock=FakeClock())
    await s.conversations.create(TENANT, Conversation("conv_1", 0), [msg("a")])  # 2, least recent
    await s.responses.put(TENANT, *resp("resp_a", n_inputs=2))  # 3
    record, inputs = resp("resp_b", n_inputs=1, conv="conv_1")  # 2, and the conversation grows to 3: 8 > 7
    await s.responses.put(TENANT, record, inputs)
    assert not await exists(s, "resp_a")
    assert [i.id for i in (await s.conversations.list_items(TENANT, "conv_1", order="asc")).items] == [
        "a",
        "resp_b_0",
    ]


async def test_returned_items_do_not_alias_stored_state() -> None:
    s = memory_stores(max_items=10, retention_s=3600, clock=FakeClock())
    body: dict[str, object] = {"id": "a", "type": "message", "content": ["x"]}
    await s.conversations.create(TENANT, Conversation("conv_1", 0), [Item.from_json(body)])
    body["content"] = ["mutated"]
    got = await s.conversations.get_item(TENANT, "conv_1", "a")
    assert got.body["content"] == ["x"]


@given(
    count=st.integers(0, 40),
    limit=st.integers(1, 12),
    order=st.sampled_from(["asc", "desc"]),
)
def test_page_window_walk_visits_each_index_once_in_order(count: int, limit: int, order: str) -> None:
    seen: list[int] = []
    cursor: int | None = None
    while True:
        window, has_more = page_window(count, cursor, limit, order)  # type: ignore[arg-type]
        assert len(window) <= limit
        assert not has_more or len(window) == limit
        seen += window
        if not has_more:
            break
        cursor = window[-1]
    assert seen == (list(range(count)) if order == "asc" else list(range(count))[::-1])
