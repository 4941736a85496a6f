"""Micro-benchmark of the mesh wire codec: encode and decode per message, in µs (one thread).

    .venv/bin/python -m bench.mesh_codec_bench

Each figure is the best of 3 runs. Gossip updates (alive/suspect/dead) are decoded once per distinct
encoding (an LRU in mesh/codec.py): each iteration here uses a new incarnation, so the decode figures are
cache misses, the worst case.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from mesh.codec import decode_messages, encode_message, open_frame, seal_frame
from mesh.member import MemberState, NodeMeta
from mesh.messages import Ack, Alive, Dead, IndirectPing, Message, Ping, PushPull, PushPullMember, Suspect, User
from mesh.state.wire import (
    Delta,
    DocState,
    Generation,
    PeerState,
    decode_delta,
    decode_state,
    encode_delta,
    encode_state,
)

META = NodeMeta.create(http_addr="10.0.0.7:8080", version="0.1.0", roles={"zone": "eu-1a", "gpu": "h100"})
ROUNDS = 20_000

MESSAGES: dict[str, Callable[[int], Message]] = {
    "ping": lambda i: Ping(i, "gw-17", "gw-3", "10.0.0.3:7946"),
    "indirect_ping": lambda i: IndirectPing(i, "gw-17", "10.0.0.17:7946", True, "gw-3", "10.0.0.3:7946"),
    "ack": Ack,
    "alive": lambda i: Alive(i, "gw-17", "10.0.0.17:7946", META),
    "suspect": lambda i: Suspect(i, "gw-17", "gw-3"),
    "dead": lambda i: Dead(i, "gw-17", "gw-3"),
    "user": lambda i: User(b"x" * 200),
}


def push_pull(members: int) -> PushPull:
    return PushPull(
        False,
        tuple(
            PushPullMember(f"gw-{n}", f"10.0.{n // 250}.{n % 250 + 1}:7946", META, n, MemberState.ALIVE)
            for n in range(members)
        ),
        b"s" * 4096,
    )


def per_call_us(fn: Callable[[int], object], rounds: int, repeats: int = 3) -> float:
    """Best of ``repeats`` runs (the least disturbed by other processes), per call."""
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for i in range(rounds):
            fn(i)
        best = min(best, time.perf_counter() - start)
    return best / rounds * 1e6


def main() -> None:
    print(f"{'message':<16} {'bytes':>6} {'encode µs':>10} {'decode µs':>10}")
    for name, make in MESSAGES.items():
        msgs = [make(i) for i in range(ROUNDS)]
        encoded = [encode_message(m) for m in msgs]
        enc = per_call_us(lambda i, msgs=msgs: encode_message(msgs[i]), ROUNDS)  # type: ignore[misc]
        dec = per_call_us(lambda i, encoded=encoded: decode_messages(encoded[i]), ROUNDS)  # type: ignore[misc]
        print(f"{name:<16} {len(encoded[1]):>6} {enc:>10.2f} {dec:>10.2f}")
    for members in (10, 100):
        pp = push_pull(members)
        frame = seal_frame(encode_message(pp), None)
        rounds = 2_000 if members < 100 else 300
        enc = per_call_us(lambda _, pp=pp: encode_message(pp), rounds)  # type: ignore[misc]
        dec = per_call_us(lambda _, frame=frame: open_frame(frame, None), rounds)  # type: ignore[misc]
        print(f"{f'push_pull({members})':<16} {len(frame):>6} {enc:>10.2f} {dec:>10.2f}")
    delta = encode_delta(Delta("r/health/0", Generation(3, "gw-1"), 2**40 + 7, 10, 11, b"d" * 90))
    enc = per_call_us(
        lambda i: encode_delta(Delta("r/health/0", Generation(3, "gw-1"), 2**40 + 7, i, i + 1, b"d" * 90)), ROUNDS
    )
    dec = per_call_us(lambda _: decode_delta(delta), ROUNDS)
    print(f"{'state delta':<16} {len(delta):>6} {enc:>10.2f} {dec:>10.2f}")
    peer = PeerState(
        "gw-1",
        tuple(
            DocState(f"r/load/{n}", Generation(1, "gw-0", 1_700_000_000_000), n % 2 == 0, b"s" * 40, b"", b"u" * 400)
            for n in range(64)
        ),
    )
    state = encode_state(peer)
    enc = per_call_us(lambda _: encode_state(peer), 2_000)
    dec = per_call_us(lambda _: decode_state(state), 2_000)
    print(f"{'state (64 docs)':<16} {len(state):>6} {enc:>10.2f} {dec:>10.2f}")


if __name__ == "__main__":
    main()
