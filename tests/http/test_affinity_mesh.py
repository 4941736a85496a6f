"""Cache affinity across nodes: the next turn of a conversation, sent to another node of the mesh, goes to the
worker the first node sent the conversation to (workers that publish no KV events, so only the routing hints
shared over the mesh can tell)."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from node.app import run_node
from tests.http._affinity import (
    assert_follow_ups_find_their_workers,
    begin_conversations,
    first_node,
    joining,
    routable,
    wait_for_gossiped_hints,
)


async def test_a_follow_up_on_another_node_finds_the_conversations_worker(llama3_model_dir: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        sims, base, a = await first_node(stack, llama3_model_dir)
        b = await stack.enter_async_context(run_node(dataclasses.replace(base, cluster=joining(a))))
        for node in (a, b):
            await routable(node)
        first, histories = await begin_conversations(a, sims)
        await wait_for_gossiped_hints(b)  # a's hints reach b by gossip
        await assert_follow_ups_find_their_workers(b, sims, first, histories)
