"""Broken workers on purpose: the simulated engine with a Generate that misbehaves (``--fault``).

Every other RPC is the real servicer's, so a faulty worker passes its health checks and reports its model:
exactly the worker a gateway must survive. Generate writes raw bytes (an identity serializer), so it can
send what no well-behaved servicer can (an unparsable message). Faults, per request:

- ``hang``: never answers Generate (a wedged engine loop behind a live socket);
- ``hang_after``: streams ``fault_after_tokens`` tokens, then goes silent;
- ``endless``: streams one token per message forever, whatever ``max_tokens`` says;
- ``oversized``: one chunk of ``fault_chunk_tokens`` ids (3M by default, ~3-9 MB on the wire), then finishes;
- ``out_of_vocab``: a token id equal to the vocabulary size;
- ``huge_cached``: ``cached_tokens`` = 2^32-1 on an otherwise normal one-token answer;
- ``garbage``: bytes that are no protobuf message at all;
- ``wrong_message``: a well-formed message of another type (a HealthCheckResponse).

Used by the fault tests and chaos demos: ``smg-node sim --fault hang ...``.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from node.sim.config import SimFault
from node.sim.grpc_server import AnyServer

SERVICE = "vllm.grpc.engine.VllmEngine"
#: What ``huge_cached`` reports: the largest uint32, as a broken counter would.
HUGE_CACHED_TOKENS = 2**32 - 1
#: Bytes no protobuf parser accepts: a field tag whose varint never ends.
GARBAGE = b"\xff" * 11
# Ids the fault answers are written with: in every real vocabulary (above the byte tokens).
_FIRST_ID = 1000
_ID_SPAN = 1000

Context = grpc.aio.ServicerContext[Any, bytes]
FaultGenerate = Callable[[Any, Context], AsyncIterator[bytes]]


def _chunk(ids: list[int], *, prompt: int, total: int, cached: int = 0, index: int = 0) -> bytes:
    msg = pb.GenerateResponse(
        chunk=pb.GenerateStreamChunk(
            token_ids=ids, prompt_tokens=prompt, completion_tokens=total, cached_tokens=cached, index=index
        )
    )
    return bytes(msg.SerializeToString())


def _complete(ids: list[int], *, prompt: int, total: int, reason: str, cached: int = 0, index: int = 0) -> bytes:
    msg = pb.GenerateResponse(
        complete=pb.GenerateComplete(
            output_ids=ids,
            finish_reason=reason,
            prompt_tokens=prompt,
            completion_tokens=total,
            cached_tokens=cached,
            index=index,
        )
    )
    return bytes(msg.SerializeToString())


def _token(k: int) -> int:
    return _FIRST_ID + k % _ID_SPAN


def fault_generate(fault: SimFault, *, vocab_size: int, after_tokens: int, chunk_tokens: int) -> FaultGenerate:
    """The Generate handler of ``fault`` (which must not be "none")."""

    async def generate(request: Any, context: Context) -> AsyncIterator[bytes]:
        prompt = len(request.tokenized.input_ids)
        if fault == "hang":
            await asyncio.Event().wait()  # until the client cancels the call
        elif fault == "hang_after":
            for k in range(after_tokens):
                yield _chunk([_token(k)], prompt=prompt, total=k + 1)
            await asyncio.Event().wait()
        elif fault == "endless":
            k = 0
            while True:  # ignores max_tokens; the HTTP/2 window paces it to the reader
                yield _chunk([_token(k)], prompt=prompt, total=k + 1)
                k += 1
        elif fault == "oversized":
            ids = [_token(k) for k in range(chunk_tokens)]
            yield _chunk(ids, prompt=prompt, total=chunk_tokens)
            yield _complete(ids, prompt=prompt, total=chunk_tokens, reason="length")
        elif fault == "out_of_vocab":
            yield _chunk([_token(0), vocab_size], prompt=prompt, total=2)
            yield _complete([_token(0), vocab_size], prompt=prompt, total=2, reason="stop")
        elif fault == "huge_cached":
            yield _chunk([_token(0)], prompt=prompt, total=1, cached=HUGE_CACHED_TOKENS)
            yield _complete([_token(0)], prompt=prompt, total=1, reason="stop", cached=HUGE_CACHED_TOKENS)
        elif fault == "garbage":
            yield GARBAGE
        elif fault == "wrong_message":
            yield bytes(pb.HealthCheckResponse(healthy=True, message="not a GenerateResponse").SerializeToString())
        else:
            raise ValueError(f"not a fault: {fault!r}")

    return generate


class _Capture:
    """Stands in for a server to collect the generated registration's method handlers."""

    def __init__(self) -> None:
        self.handlers: dict[str, grpc.RpcMethodHandler[Any, Any]] = {}

    def add_generic_rpc_handlers(self, handlers: object) -> None:
        return None

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        self.handlers.update(handlers)


def register_with_fault(servicer: object, server: AnyServer, generate: FaultGenerate) -> None:
    """Serve ``servicer``'s VllmEngine with ``generate`` as its Generate (raw bytes out)."""
    capture = _Capture()
    pb_grpc.add_VllmEngineServicer_to_server(servicer, capture)
    handlers = dict(capture.handlers)
    handlers["Generate"] = grpc.unary_stream_rpc_method_handler(
        generate,
        request_deserializer=pb.GenerateRequest.FromString,
        response_serializer=bytes,
    )
    server.add_generic_rpc_handlers((grpc.method_handlers_generic_handler(SERVICE, handlers),))
