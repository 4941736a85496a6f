"""A node that joins the mesh after the conversations began still routes their next turns to the workers holding
their prefixes: the join push-pull hands it the recent routing hints (node/cluster/hint_snapshot.py), which best-effort
gossip never repeats."""

from __future__ import annotations

import contextlib
import dataclasses
from pathlib import Path

from node.app import run_node
from tests.http._affinity import (
    assert_follow_ups_find_their_workers,
    begin_conversations,
    first_node,
    hints_received,
    joining,
    routable,
    until,
    wait_for_gossiped_hints,
)


async def test_a_late_joiner_sends_a_follow_up_to_the_conversations_worker(llama3_model_dir: Path) -> None:
    async with contextlib.AsyncExitStack() as stack:
        sims, base, a = await first_node(stack, llama3_model_dir)
        # c is there from the start: a's hints are gossiped to it and out of every broadcast queue before b joins,
        # so b can only learn them from the snapshot.
        c = await stack.enter_async_context(run_node(dataclasses.replace(base, cluster=joining(a))))
        await routable(a)
        first, histories = await begin_conversations(a, sims)

        await wait_for_gossiped_hints(c)
        await until(lambda: a.shared.hints.queued == 0 and c.shared.hints.queued == 0, "gossip to drain")
        assert len(a.shared.hint_snapshot) > 0

        b = await stack.enter_async_context(run_node(dataclasses.replace(base, cluster=joining(a))))
        await routable(b)
        assert b.shared.hint_snapshot.received > 0, "the join push-pull carried no hints"
        assert await hints_received(b.url) == 0  # none by gossip: the snapshot is all b knows
        await assert_follow_ups_find_their_workers(b, sims, first, histories)
