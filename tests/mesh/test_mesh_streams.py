"""Inbound streams of a real ``Mesh`` against strangers: bounded before the peer is known.

Large encrypted frames travel in sealed chunks (mesh/codec.py), the first authenticated before the rest is
read; every other bound is in mesh/limits.py and enforced by mesh/transport.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections.abc import AsyncIterator

import pytest

from mesh import Keyring, Mesh
from mesh.codec import check_frame_prefix, encode_message, open_frame, seal_frame
from mesh.errors import DecodeError, DecryptError, RemoteProtocolError
from mesh.limits import (
    MAX_INBOUND_BUFFER_BYTES,
    MAX_INBOUND_STREAMS_PER_HOST,
    MAX_PREAUTH_BYTES,
    MAX_STREAM_FRAME_BYTES,
    PROTOCOL_VERSION,
    STREAM_HEADER_BYTES,
    STREAM_PREAUTH_TIMEOUT_S,
)
from mesh.messages import MessageType, Ping, PushPull
from tests.mesh.test_mesh_runtime import CONFIG, Recorder, eventually

KEY, OTHER_KEY = bytes(range(32)), bytes(range(1, 33))
BIG_STATE = os.urandom(300_000)  # ~5 sealed chunks


def header(msg_type: int, length: int) -> bytes:
    return struct.pack(">BBI", PROTOCOL_VERSION, msg_type, length)


# -- chunked sealing (pure) ---------------------------------------------------------------------------------


def test_small_frames_are_sealed_whole_and_large_ones_in_authenticated_chunks() -> None:
    ring = Keyring([KEY])
    small = seal_frame(encode_message(Ping(1, "a", "b", "10.0.0.1:1")), ring)
    assert small[1] == MessageType.ENCRYPTED  # what older nodes read
    big_msg = PushPull(False, (), BIG_STATE)
    big = seal_frame(encode_message(big_msg), ring)
    assert big[1] == MessageType.ENCRYPTED_CHUNKS
    assert open_frame(big, ring) == big_msg
    for frame in (small, big):  # the first chunk authenticates the frame
        check_frame_prefix(frame[: STREAM_HEADER_BYTES + MAX_PREAUTH_BYTES], ring)
    with pytest.raises(DecryptError):
        check_frame_prefix(big[: STREAM_HEADER_BYTES + MAX_PREAUTH_BYTES], Keyring([OTHER_KEY]))
    with pytest.raises(DecryptError):  # an encrypted frame where there is no key
        check_frame_prefix(big[: STREAM_HEADER_BYTES + MAX_PREAUTH_BYTES], None)
    plain = seal_frame(encode_message(big_msg), None)
    check_frame_prefix(plain[: STREAM_HEADER_BYTES + MAX_PREAUTH_BYTES], None)
    with pytest.raises(DecryptError, match="unencrypted"):
        check_frame_prefix(plain[: STREAM_HEADER_BYTES + MAX_PREAUTH_BYTES], ring)


def test_chunks_cannot_be_reordered_dropped_or_appended() -> None:
    ring = Keyring([KEY])
    frame = seal_frame(encode_message(PushPull(False, (), BIG_STATE)), ring)
    head, payload = frame[:STREAM_HEADER_BYTES], frame[STREAM_HEADER_BYTES:]
    chunks = [payload[i : i + MAX_PREAUTH_BYTES] for i in range(0, len(payload), MAX_PREAUTH_BYTES)]
    swapped = b"".join([chunks[1], chunks[0], *chunks[2:]])
    dropped = b"".join(chunks[:-1])
    appended = payload + chunks[0]
    for body in (swapped, dropped, appended):
        forged = header(MessageType.ENCRYPTED_CHUNKS, len(body)) + body
        with pytest.raises(RemoteProtocolError):
            open_frame(forged, ring)
    assert head == header(MessageType.ENCRYPTED_CHUNKS, len(payload))


def test_a_large_frame_sealed_whole_cannot_be_authenticated_first() -> None:
    """An older node's 1 MB frame sealed whole: refused before it is read (a push-pull that large from an
    older node fails until it is upgraded -- see mesh/README.md)."""
    ring = Keyring([KEY])
    message = encode_message(PushPull(False, (), BIG_STATE))
    legacy_header = header(MessageType.ENCRYPTED, len(message) + 28)
    legacy = legacy_header + ring.seal(message, legacy_header)
    with pytest.raises(DecryptError, match="sealed whole"):
        check_frame_prefix(legacy[: STREAM_HEADER_BYTES + MAX_PREAUTH_BYTES], ring)
    assert open_frame(legacy, ring) == PushPull(False, (), BIG_STATE)  # replies we asked for are still read


def test_a_frame_header_beyond_the_bound_is_malformed() -> None:
    with pytest.raises(DecodeError):
        check_frame_prefix(header(MessageType.PUSH_PULL, MAX_STREAM_FRAME_BYTES + 1), None)


# -- real sockets -------------------------------------------------------------------------------------------


class BigState(Recorder):
    def local_state(self, join: bool) -> bytes:
        return BIG_STATE


#: Longer than the local profile's 1 s, so that the pre-authentication deadline and the buffer budget act
#: before the whole-stream deadline does.
STREAM_TIMEOUT_S = 10.0


@contextlib.asynccontextmanager
async def pair(keyring: Keyring | None) -> AsyncIterator[tuple[Mesh, Mesh, BigState]]:
    received = BigState()
    config = CONFIG.with_(tcp_timeout_s=STREAM_TIMEOUT_S)
    async with (
        Mesh(config.with_(node_name="a"), delegate=received, keyring=keyring) as a,
        Mesh(config.with_(node_name="b"), delegate=BigState(), keyring=keyring) as b,
    ):
        yield a, b, received


async def test_a_large_encrypted_push_pull_joins_through_the_preauthentication() -> None:
    async with pair(Keyring([KEY])) as (a, b, received):
        await b.join([a.addr])
        await eventually(lambda: any(state == BIG_STATE for state, _ in received.state_in))
        assert a.metrics().decrypt_failures == 0 and a.metrics().streams_refused == 0


async def open_stream(addr: str, source: str = "127.0.0.1") -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    host, port = addr.rsplit(":", 1)
    return await asyncio.open_connection(host, int(port), local_addr=(source, 0))


async def closed_by_peer(reader: asyncio.StreamReader, timeout_s: float) -> bool:
    try:
        async with asyncio.timeout(timeout_s):
            return await reader.read(1) == b""
    except TimeoutError:
        return False
    except OSError:  # reset
        return True


async def test_a_stranger_without_the_key_is_cut_off_after_one_sealed_chunk() -> None:
    async with pair(Keyring([KEY])) as (a, _, _):
        reader, writer = await open_stream(a.addr)
        # Claims the largest frame and sends garbage: the node reads the first chunk, fails to open it, closes.
        writer.write(header(MessageType.ENCRYPTED_CHUNKS, MAX_STREAM_FRAME_BYTES) + os.urandom(MAX_PREAUTH_BYTES))
        await writer.drain()
        assert await closed_by_peer(reader, 5.0)
        writer.close()
        await eventually(lambda: a.metrics().decrypt_failures >= 1)
        # Plaintext to a keyed node: refused on the header and first bytes, not after 16 MiB.
        reader, writer = await open_stream(a.addr)
        writer.write(header(MessageType.PUSH_PULL, MAX_STREAM_FRAME_BYTES) + bytes(1000))
        await writer.drain()
        assert await closed_by_peer(reader, 5.0)
        writer.close()
        await eventually(lambda: a.metrics().decrypt_failures >= 2)


async def test_streams_from_one_address_are_capped_and_the_refusal_counted() -> None:
    async with pair(None) as (a, _, _):
        held = [await open_stream(a.addr) for _ in range(MAX_INBOUND_STREAMS_PER_HOST)]
        await asyncio.sleep(0.2)  # let the node accept them all
        reader, writer = await open_stream(a.addr)
        assert await closed_by_peer(reader, 1.0)  # at once: well before the pre-authentication deadline
        writer.close()
        await eventually(lambda: a.metrics().streams_refused >= 1)
        other_reader, other_writer = await open_stream(a.addr, source="127.0.0.2")  # another address still gets in
        assert not await closed_by_peer(other_reader, 0.3)
        other_writer.close()
        for _, w in held:
            w.close()


async def test_a_stream_that_does_not_authenticate_in_time_is_closed() -> None:
    async with pair(None) as (a, _, _):
        reader, writer = await open_stream(a.addr)
        writer.write(header(MessageType.PUSH_PULL, 1_000_000)[:4])  # part of a header, then nothing
        await writer.drain()
        loop = asyncio.get_running_loop()
        started = loop.time()
        assert await closed_by_peer(reader, STREAM_PREAUTH_TIMEOUT_S + 3.0)
        assert loop.time() - started < STREAM_PREAUTH_TIMEOUT_S + 1.0  # not tcp_timeout_s
        writer.close()
        await eventually(lambda: a.metrics().streams_refused >= 1)


async def test_the_shared_buffer_refuses_streams_past_its_budget() -> None:
    """Keyless (nothing to authenticate): big frames from many addresses share MAX_INBOUND_BUFFER_BYTES."""
    piece = 8 * 1024 * 1024
    streams = MAX_INBOUND_BUFFER_BYTES // piece + 2
    async with pair(None) as (a, _, _):
        opened = [await open_stream(a.addr, source=f"127.0.2.{k + 1}") for k in range(streams)]
        for _, writer in opened:
            writer.write(header(MessageType.PUSH_PULL, MAX_STREAM_FRAME_BYTES))
        chunk = bytes(64 * 1024)

        async def push(writer: asyncio.StreamWriter) -> None:
            with contextlib.suppress(OSError):
                for _ in range(piece // len(chunk)):
                    writer.write(chunk)
                    await writer.drain()

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(8.0):
                await asyncio.gather(*(push(w) for _, w in opened))
        await eventually(lambda: a.metrics().streams_refused >= 1)
        for _, writer in opened:
            writer.close()
