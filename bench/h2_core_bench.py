"""µs of CPU per received Generate message: our sans-IO core (node/workers/h2_connection.py) vs the `h2` library.

    .venv/bin/python -m bench.h2_core_bench

Both parse the same bytes: 16 streams, each a response HEADERS, 200 DATA frames of one ~20-byte gRPC message
(a one-token GenerateStreamChunk) and trailers, delivered in reads of 4 frames (about what one wake-up of the
reader sees at 16 concurrent streams). Only the receive path is timed; no sockets, no event loop.
"""

from __future__ import annotations

import time

import hpack

from node.workers import h2_frames as f
from node.workers.grpc_wire import MessageReader, encode_message
from node.workers.h2_connection import H2Connection

STREAMS = 16
MESSAGES = 200
MESSAGE = bytes(range(20))


def _wire() -> list[bytes]:
    enc = hpack.Encoder()
    frames: list[bytes] = [f.settings_frame({f.SETTINGS_MAX_CONCURRENT_STREAMS: 100})]
    frames += [
        f.frame(f.HEADERS, f.FLAG_END_HEADERS, sid, enc.encode([(":status", "200")]))
        for sid in range(1, 2 * STREAMS, 2)
    ]
    for _ in range(MESSAGES):
        frames += [f.frame(f.DATA, 0, sid, encode_message(MESSAGE)) for sid in range(1, 2 * STREAMS, 2)]
    for sid in range(1, 2 * STREAMS, 2):
        frames.append(
            f.frame(f.HEADERS, f.FLAG_END_HEADERS | f.FLAG_END_STREAM, sid, enc.encode([("grpc-status", "0")]))
        )
    return [b"".join(frames[i : i + 4]) for i in range(0, len(frames), 4)]


def ours(reads: list[bytes]) -> float:
    conn = H2Connection(1 << 20)
    conn.initiate()
    streams = [conn.open_stream(b"\x83", encode_message(b"req")) for _ in range(STREAMS)]
    start = time.process_time()
    for data in reads:
        for stream in conn.receive_data(data):
            stream.messages = []
    elapsed = time.process_time() - start
    assert all(s.ended and s.status is not None and s.status.code == 0 for s in streams)
    return elapsed


def library(reads: list[bytes]) -> float:
    import h2.config
    import h2.connection
    import h2.events

    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True, header_encoding=None))
    conn.initiate_connection()
    for _ in range(STREAMS):
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "POST"), (":scheme", "http"), (":path", "/x"), (":authority", "a")])
        conn.send_data(sid, encode_message(b"req"), end_stream=True)
    conn.data_to_send()
    readers = {sid: MessageReader(1 << 20) for sid in range(1, 2 * STREAMS, 2)}
    out: list[bytes] = []
    ended = 0
    start = time.process_time()
    for data in reads:
        for event in conn.receive_data(data):
            if isinstance(event, h2.events.DataReceived):
                readers[event.stream_id].feed(event.data, out)
                conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            elif isinstance(event, h2.events.StreamEnded):
                ended += 1
        conn.data_to_send()
        out.clear()
    elapsed = time.process_time() - start
    assert ended == STREAMS
    return elapsed


def main() -> None:
    reads = _wire()
    total = STREAMS * MESSAGES
    for name, fn in (("ours", ours), ("h2", library)):
        best = min(fn(reads) for _ in range(5))
        print(f"{name:5} {1e6 * best / total:6.2f} µs per message")


if __name__ == "__main__":
    main()
