"""The join snapshot of recent routing hints (node/cluster/hint_snapshot.py) and aged hint messages (affinity.aged)."""

from __future__ import annotations

from node.cluster.hint_snapshot import HintSnapshot
from node.routing.affinity import AffinityHints, aged
from node.routing.block_hashes import BlockHashes

PAGE = 4


def _hints(clock: list[float]) -> AffinityHints:
    return AffinityHints(PAGE, ttl_s=100, max_entries=10_000, max_message_bytes=1000, clock=lambda: clock[0])


def _message(prompt: list[int], url: str) -> bytes:
    origin = _hints([0.0])
    origin.learn(BlockHashes(prompt, 16), url)
    (msg,) = origin.take_outgoing()
    return msg


PROMPT = list(range(40))
OTHER = list(range(100, 180))


def test_an_aged_hint_expires_when_it_would_have_where_it_was_made() -> None:
    clock = [1000.0]
    peer = _hints(clock)
    peer.receive(aged(_message(PROMPT, "grpc://w1:1"), 60.0))
    assert peer.match(BlockHashes(PROMPT, 16)) == {"grpc://w1:1": 40}
    clock[0] += 39.0
    assert peer.match(BlockHashes(PROMPT, 16)) == {"grpc://w1:1": 40}
    clock[0] += 2.0  # 101 s after it was made: past the 100 s TTL
    assert peer.match(BlockHashes(PROMPT, 16)) == {}
    peer.receive(aged(_message(PROMPT, "grpc://w1:1"), 150.0))  # older than the TTL: not even stored
    assert peer.match(BlockHashes(PROMPT, 16)) == {} and peer.rejected == 0


def test_an_aged_hint_never_replaces_a_fresher_one() -> None:
    clock = [1000.0]
    peer = _hints(clock)
    peer.receive(_message(PROMPT, "grpc://fresh:1"))
    peer.receive(aged(_message(PROMPT, "grpc://old:1"), 30.0))
    assert peer.match(BlockHashes(PROMPT, 16)) == {"grpc://fresh:1": 40}
    peer.receive(aged(b"\x02\x00", 0.0))  # a truncated aged message
    assert peer.rejected == 1


def test_the_snapshot_travels_only_on_a_join_with_the_messages_ages() -> None:
    clock = [500.0]
    seed = HintSnapshot(lambda _msg: None, clock=lambda: clock[0])
    old, new = _message(PROMPT, "grpc://w1:1"), _message(OTHER, "grpc://w2:1")
    seed.record(old)
    clock[0] += 20.0
    seed.record(new)
    seed.record(new)  # a duplicate is kept once
    clock[0] += 5.0
    assert seed.local_state(join=False) == b""  # periodic push-pulls carry nothing
    joiner_clock = [10.0]
    joiner = _hints(joiner_clock)
    snapshot = HintSnapshot(joiner.receive, clock=lambda: joiner_clock[0])
    snapshot.merge_remote_state(seed.local_state(join=True), True)
    assert snapshot.received == 2 and len(snapshot) == 2
    assert joiner.match(BlockHashes(PROMPT, 16)) == {"grpc://w1:1": 40}
    joiner_clock[0] += 100.0 - 25.0 + 1.0  # the first hint, made 25 s before the join, is past its TTL
    assert joiner.match(BlockHashes(PROMPT, 16)) == {}
    assert joiner.match(BlockHashes(OTHER, 16)) == {"grpc://w2:1": 80}
    # The joiner passes them on with their ages.
    third = _hints([0.0])
    HintSnapshot(third.receive).merge_remote_state(snapshot.local_state(join=True), True)
    assert third.match(BlockHashes(OTHER, 16)) == {"grpc://w2:1": 80}


def test_the_snapshot_is_bounded_and_garbage_is_counted() -> None:
    snapshot = HintSnapshot(lambda _msg: None, max_bytes=1000)
    for i in range(50):
        snapshot.record(_message([i, *PROMPT], f"grpc://w{i}:1"))
    state = snapshot.local_state(join=True)
    assert len(state) <= 1 + 1000 and 0 < len(snapshot) < 50
    other = HintSnapshot(lambda _msg: None)
    for bad in (b"\x09", state[:-3], b"\x01\x00"):
        other.merge_remote_state(bad, True)
    assert other.malformed == 3
