"""The gRPC edge: ``vllm.grpc.engine.VllmEngine`` served over the simulated engine.

Errors are mapped here once: InvalidRequestError -> INVALID_ARGUMENT, EngineClosedError -> UNAVAILABLE.
Embeddings, profiling and multimodal input are not simulated.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import zipfile
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

import grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2, vllm_engine_pb2_grpc

from node.sim import wire
from node.sim.engine import SequenceOutput, SimEngine
from node.sim.errors import EngineClosedError, InvalidRequestError
from node.sim.grpc_server import AnyServer
from node.sim.logprobs import TokenLogprobs
from node.sim.logprobs import simulate as simulate_logprobs

logger = logging.getLogger(__name__)

Context = grpc.aio.ServicerContext[Any, Any]

# GetTokenizer streams the zipped tokenizer files in chunks of this size (well under gRPC's 4 MiB default).
TOKENIZER_CHUNK_BYTES = 1 << 20
# Files of a model folder that make up its tokenizer bundle.
_TOKENIZER_SUFFIXES = (".json", ".jinja", ".model", ".txt", ".tiktoken")
_NOT_TOKENIZER_FILES = frozenset({"config.json", "model.safetensors.index.json"})


class SimEngineServicer:
    """Handlers for every RPC of the service (the generated registration helper needs them all)."""

    def __init__(self, engine: SimEngine) -> None:
        self._engine = engine

    def register(self, server: AnyServer) -> None:
        vllm_engine_pb2_grpc.add_VllmEngineServicer_to_server(self, server)

    async def Generate(self, request: Any, context: Context) -> AsyncIterator[Any]:
        engine = self._engine
        try:
            spec = wire.generate_spec(request, engine.model.max_context_length)
            outputs = engine.submit(spec)
        except InvalidRequestError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        except EngineClosedError as exc:
            await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        stream = bool(request.stream)
        params = request.sampling_params
        # None: no logprobs asked; 0: the sampled token's logprob only (as vLLM counts top-k).
        top_n = int(params.logprobs) if params.HasField("logprobs") else None
        vocab = engine.model.vocab_size
        collected: dict[int, list[int]] = {}
        finals: dict[int, SequenceOutput] = {}
        n = spec.sampling.n
        async with contextlib.aclosing(outputs):
            try:
                async for output in outputs:
                    for reply in self._replies(
                        output, stream=stream, n=n, collected=collected, finals=finals, top_n=top_n, vocab=vocab
                    ):
                        yield reply
            except Exception as exc:
                logger.exception("Generate %s failed", spec.request_id)
                await context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")

    @staticmethod
    def _replies(
        output: SequenceOutput,
        *,
        stream: bool,
        n: int,
        collected: dict[int, list[int]],
        finals: dict[int, SequenceOutput],
        top_n: int | None,
        vocab: int,
    ) -> list[Any]:
        """What the reference servicer sends for one engine output."""

        def lp(ids: Sequence[int], start: int) -> TokenLogprobs | None:
            if top_n is None:
                return None
            return simulate_logprobs(ids, start=start, top_n=max(top_n, 1), vocab_size=vocab)

        if stream:
            start = output.output_tokens - len(output.token_ids)
            delta_lp = lp(output.token_ids, start)
            replies = [wire.chunk_response(output, delta_lp)]
            if output.finish is not None:
                replies.append(wire.complete_response(output, output.token_ids, delta_lp))
            return replies
        collected.setdefault(output.index, []).extend(output.token_ids)
        if output.finish is None:
            return []
        finals[output.index] = output
        if len(finals) < n:
            return []
        # Without streaming vLLM answers once every index is done, in index order.
        return [wire.complete_response(finals[i], ids := collected.get(i, []), lp(ids, 0)) for i in sorted(finals)]

    async def Embed(self, request: Any, context: Context) -> Any:
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "the simulated engine does not embed")

    async def HealthCheck(self, request: Any, context: Context) -> Any:
        healthy = not self._engine.closed
        return vllm_engine_pb2.HealthCheckResponse(
            healthy=healthy, message="Health" if healthy else "Engine is shutting down"
        )

    async def FlushCache(self, request: Any, context: Context) -> Any:
        success, message = await self._engine.flush_cache(float(request.timeout_s))
        return common_pb2.FlushCacheResponse(success=success, message=message)

    async def StartProfile(self, request: Any, context: Context) -> Any:
        return common_pb2.ProfileResponse(success=False, message="the simulated engine has no profiler")

    async def StopProfile(self, request: Any, context: Context) -> Any:
        return common_pb2.ProfileResponse(success=False, message="the simulated engine has no profiler")

    async def Abort(self, request: Any, context: Context) -> Any:
        request_ids = [str(i) for i in request.request_ids]
        logger.debug("Abort %s", request_ids)
        self._engine.abort(request_ids)
        return vllm_engine_pb2.AbortResponse()

    async def GetModelInfo(self, request: Any, context: Context) -> Any:
        return wire.model_info_response(self._engine.model)

    async def GetServerInfo(self, request: Any, context: Context) -> Any:
        engine = self._engine
        return wire.server_info_response(
            engine.server_snapshot(),
            kv_role=engine.config.kv_role,
            engine_id=engine.engine_id,
            block_size=engine.config.block_size,
            max_num_seqs=engine.config.max_running_requests,
        )

    async def GetLoads(self, request: Any, context: Context) -> Any:
        return wire.loads_response(self._engine.load_snapshot())

    async def GetTokenizer(self, request: Any, context: Context) -> AsyncIterator[Any]:
        bundle = tokenizer_bundle(self._engine.model.tokenizer_path)
        digest = hashlib.sha256(bundle).hexdigest()
        for start in range(0, len(bundle), TOKENIZER_CHUNK_BYTES):
            end = start + TOKENIZER_CHUNK_BYTES
            yield common_pb2.GetTokenizerChunk(data=bundle[start:end], sha256=digest if end >= len(bundle) else "")

    async def SubscribeKvEvents(self, request: Any, context: Context) -> AsyncIterator[Any]:
        if not self._engine.config.kv_events:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED, "this engine publishes no KV events")
        # Headers first, so the subscriber's call resolves before the first batch (as the reference does).
        await context.send_initial_metadata(())
        batches = self._engine.kv_batches(int(request.start_sequence_number))
        async with contextlib.aclosing(batches):
            async for batch in batches:
                yield wire.kv_batch_message(batch)


def tokenizer_bundle(folder: Path) -> bytes:
    """A zip of the folder's tokenizer files (tokenizer.json, tokenizer_config.json, templates, ...)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression=zipfile.ZIP_DEFLATED) as archive:
        for file in sorted(folder.iterdir()):
            if file.is_file() and file.suffix in _TOKENIZER_SUFFIXES and file.name not in _NOT_TOKENIZER_FILES:
                archive.write(file, arcname=file.name)
    return buffer.getvalue()
