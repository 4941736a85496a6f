"""Conversions between the protobuf messages of ``vllm.grpc.engine.VllmEngine`` and the engine's types.

The generated modules are untyped, so ``Any`` lives here and in the servicer and nowhere else. The shapes
follow the reference servicer (smg-grpc-servicer's ``VllmEngineServicer``): stream chunks carry the new
token ids with delta ``completion_tokens`` and the prompt and cached counts; a sequence's last chunk is
followed by a ``complete`` repeating that last delta; without streaming, one ``complete`` per index holds
every token.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import Any

from smg_grpc_proto.generated import vllm_engine_pb2

from node.sim.engine import GenerateSpec, LoadSnapshot, SequenceOutput, ServerSnapshot
from node.sim.errors import InvalidRequestError
from node.sim.kv_events import KvBatch
from node.sim.logprobs import TokenLogprobs
from node.sim.model_folder import ModelFolder
from node.sim.token_generator import SamplingSpec
from node.structured.constraint import Constraint, ConstraintError, check_regex, check_schema
from node.workers.kv_convert import batch_message

SERVER_TYPE = "vllm-grpc"
ENGINE_VERSION = "smg-node-sim"


def generate_spec(request: Any, max_context_length: int) -> GenerateSpec:
    """The engine request behind a GenerateRequest.

    Raises:
        InvalidRequestError: text or multimodal input, or kv_transfer_params_json that is not a JSON object.
    """
    kind = request.WhichOneof("input")
    if kind == "text":
        raise InvalidRequestError("text input is not supported: send tokenized.input_ids")
    if kind != "tokenized":
        raise InvalidRequestError("the request carries no tokenized input")
    if request.HasField("mm_inputs") or request.HasField("media_refs") or len(request.extra_mm_inputs):
        raise InvalidRequestError("multimodal input is not supported by the simulated engine")
    prompt = tuple(request.tokenized.input_ids)  # ints already (repeated uint32); a genexpr cost ~0.5 ms per 7,800
    params = request.sampling_params
    if params.HasField("truncate_prompt_tokens"):
        keep = int(params.truncate_prompt_tokens)
        keep = max_context_length if keep < 0 else keep
        prompt = prompt[-keep:] if keep else prompt
    kv_params: Mapping[str, object] | None = None
    if request.HasField("kv_transfer_params_json"):
        try:
            decoded = json.loads(request.kv_transfer_params_json)
        except ValueError as exc:
            raise InvalidRequestError(f"kv_transfer_params_json is not JSON: {exc}") from exc
        if not isinstance(decoded, dict):
            raise InvalidRequestError("kv_transfer_params_json must be a JSON object")
        kv_params = decoded
    return GenerateSpec(
        request_id=str(request.request_id),
        prompt_ids=prompt,
        sampling=sampling_spec(params),
        kv_transfer_params=kv_params,
    )


def constraint_of(params: Any) -> Constraint | None:
    """The structured-output constraint of SamplingParams, checked as an engine compiling it would.

    Raises:
        InvalidRequestError: a json_schema that is not a JSON schema, a regex a decoder cannot apply, an empty
            choice list or grammar.
    """
    kind = params.WhichOneof("constraint")
    if kind is None:
        return None
    try:
        if kind == "choice":
            choices = tuple(str(c) for c in params.choice.choices)
            if not choices:
                raise ConstraintError("the choice list is empty", param=kind)
            return Constraint("choice", choices=choices)
        if kind == "json_object":
            return Constraint("json_object") if params.json_object else None
        text = str(getattr(params, kind))
        if kind == "json_schema":
            try:
                check_schema(json.loads(text), kind)
            except ValueError as exc:
                if isinstance(exc, ConstraintError):
                    raise
                raise ConstraintError(f"not JSON: {exc}", param=kind) from exc
        elif kind == "regex":
            check_regex(text, kind)
        elif kind == "grammar" and not text.strip():
            raise ConstraintError("the grammar is empty", param=kind)
        return Constraint(kind, text)
    except ConstraintError as exc:
        raise InvalidRequestError(f"invalid {kind} constraint: {exc.message}") from exc


def sampling_spec(params: Any) -> SamplingSpec:
    """The sampling parameters the engine acts on, with vLLM's defaults for unset fields.

    Raises:
        InvalidRequestError: the constraint cannot be applied (``constraint_of``).
    """
    temperature = float(params.temperature) if params.HasField("temperature") else 1.0
    return SamplingSpec(
        max_tokens=int(params.max_tokens) if params.HasField("max_tokens") else None,
        min_tokens=int(params.min_tokens),
        stop_token_ids=tuple(int(i) for i in params.stop_token_ids),
        ignore_eos=bool(params.ignore_eos),
        seed=int(params.seed) if params.HasField("seed") else None,
        n=int(params.n) or 1,
        knobs=(
            temperature,
            float(params.top_p) or 1.0,
            float(params.top_k),
            float(params.min_p),
            float(params.frequency_penalty),
            float(params.presence_penalty),
            float(params.repetition_penalty) or 1.0,
        ),
        constraint=constraint_of(params),
    )


def _logprobs_message(lp: TokenLogprobs | None) -> Any:
    if lp is None or not lp.token_ids:
        return None
    return vllm_engine_pb2.OutputLogProbs(
        token_logprobs=lp.logprobs,
        token_ids=lp.token_ids,
        top_logprobs=[
            vllm_engine_pb2.TopLogProbs(values=v, token_ids=i) for i, v in zip(lp.top_ids, lp.top_logprobs, strict=True)
        ],
    )


def chunk_response(output: SequenceOutput, logprobs: TokenLogprobs | None = None) -> Any:
    return vllm_engine_pb2.GenerateResponse(
        chunk=vllm_engine_pb2.GenerateStreamChunk(
            token_ids=output.token_ids,
            prompt_tokens=output.prompt_tokens,
            completion_tokens=len(output.token_ids),
            cached_tokens=output.cached_tokens,
            index=output.index,
            output_logprobs=_logprobs_message(logprobs),
        )
    )


def complete_response(
    output: SequenceOutput, output_ids: tuple[int, ...] | list[int], logprobs: TokenLogprobs | None = None
) -> Any:
    """The ``complete`` of a finished index; ``output_ids`` is the last delta (stream) or every token."""
    finish = output.finish
    complete = vllm_engine_pb2.GenerateComplete(
        output_ids=output_ids,
        finish_reason=finish.reason if finish is not None else "stop",
        prompt_tokens=output.prompt_tokens,
        completion_tokens=len(output_ids),
        cached_tokens=output.cached_tokens,
        index=output.index,
        output_logprobs=_logprobs_message(logprobs),
    )
    if finish is not None and finish.matched_token_id is not None:
        complete.matched_token_id = finish.matched_token_id
    if output.kv_transfer_params is not None:
        complete.kv_transfer_params_json = json.dumps(output.kv_transfer_params, separators=(",", ":"))
    return vllm_engine_pb2.GenerateResponse(complete=complete)


def model_info_response(model: ModelFolder) -> Any:
    defaults = json.dumps(dict(model.sampling_defaults), separators=(",", ":")) if model.sampling_defaults else ""
    return vllm_engine_pb2.GetModelInfoResponse(
        model_path=str(model.path),
        is_generation=True,
        max_context_length=model.max_context_length,
        vocab_size=model.vocab_size,
        supports_vision=False,
        served_model_name=model.served_model_name,
        tokenizer_path=str(model.tokenizer_path),
        model_type=model.model_type,
        architectures=list(model.architectures),
        eos_token_ids=list(model.eos_token_ids),
        pad_token_id=model.pad_token_id or 0,
        bos_token_id=model.bos_token_id or 0,
        max_req_input_len=model.max_context_length,
        default_sampling_params_json=defaults,
    )


def server_info_response(
    snapshot: ServerSnapshot, *, kv_role: str, engine_id: str, block_size: int, max_num_seqs: int
) -> Any:
    return vllm_engine_pb2.GetServerInfoResponse(
        active_requests=snapshot.active_requests,
        is_paused=False,
        last_receive_timestamp=snapshot.last_receive_timestamp,
        uptime_seconds=snapshot.uptime_s,
        server_type=SERVER_TYPE,
        kv_connector="",
        kv_role=kv_role,
        kv_engine_id=engine_id if kv_role else "",
        data_parallel_size=1,
        kv_cache_dtype="auto",
        block_size=block_size,
        max_num_seqs=max_num_seqs,
    )


def loads_response(load: LoadSnapshot, now: datetime | None = None) -> Any:
    stamp = (now or datetime.now(UTC)).isoformat()
    scheduler_load = vllm_engine_pb2.SchedulerLoad(
        dp_rank=0,
        num_running_reqs=load.running_requests,
        num_waiting_reqs=load.waiting_requests,
        num_total_reqs=load.running_requests + load.waiting_requests,
        num_used_tokens=load.used_tokens,
        max_total_num_tokens=load.capacity_tokens,
        token_usage=load.token_usage,
        cache_hit_rate=load.cache_hit_rate,
        max_running_requests=load.max_running_requests,
        num_waiting_uncached_tokens=load.waiting_uncached_tokens,
    )
    return vllm_engine_pb2.GetLoadsResponse(
        timestamp=stamp, version=ENGINE_VERSION, dp_rank_count=1, loads=[scheduler_load]
    )


def kv_batch_message(batch: KvBatch) -> Any:
    return batch_message(
        batch.sequence_number, batch.timestamp, ((n.event_id, n.event) for n in batch.events), batch.snapshot
    )
