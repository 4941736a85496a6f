"""Health verdicts merge the observations of live nodes: one broken link is not an outage, nobody's
reach is."""

from __future__ import annotations

from mesh.state import ClusterState
from node.cluster.health import HealthBoard
from node.cluster.state import state_config


def boards(*names: str) -> tuple[list[ClusterState], list[HealthBoard]]:
    states = [ClusterState(n, state_config()) for n in names]
    return states, [HealthBoard(s, publish_interval_s=5.0, clock=lambda: 100.0) for s in states]


def sync(states: list[ClusterState]) -> None:
    for a in states:
        for b in states:
            if a is not b:
                b.merge_remote_state(a.local_state(True), True)


def test_one_broken_link_keeps_the_worker_in_for_everybody_else() -> None:
    states, (a, b, c) = boards("a", "b", "c")
    a.observe("w1", False, error="connection refused")
    b.observe("w1", True, running=3)
    sync(states)
    assert [x.cluster_ok("w1") for x in (a, b, c)] == [True, True, True]
    assert (a.routable("w1"), b.routable("w1")) == (False, True), "a cannot reach it, b can"
    assert c.routable("w1"), "c has no view of its own yet: it trusts the cluster"
    obs = c.observations("w1")
    assert set(obs) == {"a", "b"} and obs["a"].error == "connection refused" and obs["b"].running == 3


def test_a_worker_nobody_reaches_is_out_everywhere() -> None:
    states, (a, b, c) = boards("a", "b", "c")
    for x in (a, b):
        x.observe("w1", True)
    sync(states)
    for x in (a, b):
        x.observe("w1", False)  # a flip is published at once, no waiting for the publish interval
    sync(states)
    assert [x.cluster_ok("w1") for x in (a, b, c)] == [False, False, False]
    assert not c.routable("w1")
    assert c.cluster_ok("w-unknown") is None


def test_dead_nodes_observations_stop_counting() -> None:
    states, (a, b) = boards("a", "b")
    a.observe("w1", True)
    b.observe("w1", False)
    sync(states)
    assert b.cluster_ok("w1") is True
    states[1].tick(200.0, alive={"b"})  # a is gone
    b.tick()
    assert b.cluster_ok("w1") is False


def test_load_changes_wait_for_the_publish_interval() -> None:
    now = [0.0]
    state = ClusterState("a", state_config())
    board = HealthBoard(state, publish_interval_s=5.0, clock=lambda: now[0])
    board.observe("w1", True, running=1)
    board.observe("w1", True, running=9)
    assert state.rows("health")["a"]["w1"][2] == 1, "a load-only change went out before the interval"
    now[0] = 6.0
    board.tick()
    assert state.rows("health")["a"]["w1"][2] == 9
    board.forget("w1")
    assert "w1" not in state.rows("health").get("a", {})
