"""WorkerClient over the published engine contract `vllm.grpc.engine.VllmEngine` (PyPI: smg-grpc-proto).

Protobuf messages are untyped; they are built and read only in this module, so `Any` stops here.
One channel per worker is reused by every request (HTTP/2 multiplexing). Generate streams are read either
through that channel or, by default, through our own HTTP/2 connection (``node.workers.h2_generate``: a
fraction of grpc.aio's CPU per streamed message). The health checks' HealthCheck and GetLoads, sent to every
worker every interval, take the same connection when it is in use; every other RPC stays on grpc.aio.
"""

from __future__ import annotations

import asyncio
import logging
import math
from array import array
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any, Final

import grpc
from google.protobuf.message import DecodeError  # type: ignore[import-untyped,unused-ignore]  # stubs optional
from smg_grpc_proto.generated import common_pb2
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from node.config import DEFAULT_GENERATE_TRANSPORT, GenerateTransport
from node.errors import KvEventsUnsupported, WorkerFailed
from node.routing.kv_events import KvEventBatch
from node.workers.channel_config import ChannelConfig
from node.workers.client import WorkerRejected, WorkerUnavailable, flattened
from node.workers.grpc_wire import UNIMPLEMENTED
from node.workers.h2_generate import CallFailed, H2GenerateChannel, RawPush
from node.workers.kv_convert import EngineLoad, convert_batch, convert_get_loads, convert_load_record
from node.workers.packed_ids import field_tag, packed_uint32, varint
from node.workers.types import ModelInfo, Pushed, SamplingParams, TokenLogprobs, WorkerOutput, WorkerRequest
from node.workers.worker_address import (
    PinnedTarget,
    Resolver,
    WorkerAddressError,
    WorkerUnresolved,
    checked_addresses,
    system_resolve,
)
from node.workers.worker_url import NetworkPolicy, parse_target

try:
    from node.workers._rx import chunks as _plain_chunks
except ImportError:  # installed without a C compiler: protobuf parses every message
    _plain_chunks = None  # type: ignore[assignment]

log = logging.getLogger(__name__)

# Prompts of 128k tokens are ~0.5 MB of varints; logprobs and snapshots can be larger. Bounded, not unlimited.
MAX_MESSAGE_BYTES = 64 * 1024 * 1024
# Statuses that blame the request, not the worker (WorkerRejected): no mark against its circuit breaker.
REQUEST_FAULT_STATUSES = frozenset({"INVALID_ARGUMENT", "OUT_OF_RANGE", "ALREADY_EXISTS"})
# The status of a worker that could not take the call (WorkerUnavailable): another worker may.
UNAVAILABLE_STATUS = "UNAVAILABLE"
#: A named worker's addresses are looked up again on a health check this long after the last lookup (at once
#: after a failed check): follows a worker that moved without a DNS query per check.
REFRESH_S = 30.0
#: Channels to a named worker's previous addresses stay open this long for the calls running there (the
#: default request_timeout_s), then close.
RETIRE_GRACE_S = 600.0
_GENERATE_PATH = "/vllm.grpc.engine.VllmEngine/Generate"
_HEALTH_PATH = "/vllm.grpc.engine.VllmEngine/HealthCheck"
_LOADS_PATH = "/vllm.grpc.engine.VllmEngine/GetLoads"
_HEALTH_REQUEST = pb.HealthCheckRequest().SerializeToString()
_LOADS_REQUEST = pb.GetLoadsRequest().SerializeToString()
# Health checks (HealthCheck, GetLoads) over the h2 connection instead of grpc.aio: off. Against vLLM's real
# server a GetLoads on an idle h2 connection sometimes never completed (DEADLINE_EXCEEDED in the real-engine tier,
# 2 runs of 4), which would mark a busy, healthy engine unhealthy; grpc.aio's channel reconnects on its own.
# The h2 unary path stays (tested) until that race is found.
_CHECKS_OVER_H2 = False
_EOF: object = grpc.aio.EOF  # type: ignore[attr-defined]  # (grpc-stubs lacks it) what read() returns at the end


def _sampling_params(p: SamplingParams) -> Any:
    msg = pb.SamplingParams(
        top_p=p.top_p,
        top_k=p.top_k,
        min_p=p.min_p,
        frequency_penalty=p.frequency_penalty,
        presence_penalty=p.presence_penalty,
        repetition_penalty=p.repetition_penalty,
        max_tokens=p.max_tokens,
        min_tokens=p.min_tokens,
        stop_token_ids=p.stop_token_ids,
        skip_special_tokens=p.skip_special_tokens,
        ignore_eos=p.ignore_eos,
        n=p.n,
    )
    if p.temperature is not None:
        msg.temperature = p.temperature
    if p.seed is not None:
        msg.seed = p.seed
    if p.logprobs is not None:
        msg.logprobs = p.logprobs
    c = p.constraint
    if c is not None:
        if c.kind == "choice":
            msg.choice.choices.extend(c.choices)
        elif c.kind == "json_object":
            msg.json_object = True
        else:  # json_schema, regex, grammar, structural_tag: the oneof member of the same name
            setattr(msg, c.kind, c.text)
    return msg


def _logprobs(msg: Any) -> TokenLogprobs | None:
    if not msg.token_ids:
        return None
    return TokenLogprobs(
        token_ids=tuple(msg.token_ids),
        logprobs=tuple(msg.token_logprobs),
        top_ids=tuple(tuple(t.token_ids) for t in msg.top_logprobs),
        top_logprobs=tuple(tuple(t.values) for t in msg.top_logprobs),
    )


def _output(resp: Any) -> WorkerOutput:
    kind = resp.WhichOneof("response")
    if kind == "chunk":
        c = resp.chunk
        return WorkerOutput(
            index=c.index,
            token_ids=c.token_ids,
            prompt_tokens=c.prompt_tokens,
            completion_tokens=c.completion_tokens,
            cached_tokens=c.cached_tokens,
            logprobs=_logprobs(c.output_logprobs) if c.HasField("output_logprobs") else None,
        )
    if kind == "complete":
        c = resp.complete
        reason = c.finish_reason or "stop"
        if reason == "error":
            raise WorkerFailed("the worker reported an error while generating")
        return WorkerOutput(
            index=c.index,
            token_ids=c.output_ids,
            prompt_tokens=c.prompt_tokens,
            completion_tokens=c.completion_tokens,
            cached_tokens=c.cached_tokens,
            finish_reason=reason,
            matched_token_id=c.matched_token_id if c.WhichOneof("matched_stop") == "matched_token_id" else None,
            logprobs=_logprobs(c.output_logprobs) if c.HasField("output_logprobs") else None,
            kv_transfer_params_json=(c.kv_transfer_params_json if c.HasField("kv_transfer_params_json") else None),
        )
    raise WorkerFailed(f"the worker sent an empty Generate response ({kind!r})")


# The first byte of a serialized GenerateResponse whose oneof is ``chunk`` (field 1, length-delimited): its only
# field, so it leads. A peek that decides only whether a message may take the merged path below.
_CHUNK_TAG = b"\n"


def _outputs(batch: list[bytes], parse: Any, merge: bool) -> list[WorkerOutput]:
    """The messages of one read as WorkerOutputs. With ``merge`` (one choice, no logprobs asked) a run of three
    or more chunks leaves as two: the run's ids but the last message's in one, then the last message as sent
    (vLLM's final message repeats the last chunk's ids: the Output stage and the worker contract compare it
    with the last chunk as sent). Every message is still parsed on its own (a malformed one fails as alone);
    what is saved is a WorkerOutput, a contract check and an Output step per message."""
    if _plain_chunks is not None:
        # The C decoder takes a batch of plain chunks (ids and counts only: a streamed token's message) and
        # builds the same outputs, merged the same way; anything else it declines, and protobuf parses below.
        plain: list[WorkerOutput] | None = _plain_chunks(batch, WorkerOutput, merge)
        if plain is not None:
            return plain
    if not merge or len(batch) < 3:
        return [_output(parse(data)) for data in batch]
    outs: list[WorkerOutput] = []
    run: list[bytes] = []
    for data in batch:
        if data[:1] == _CHUNK_TAG:
            run.append(data)
            continue
        if run:
            _merge_run(run, parse, outs)
            run = []
        outs.append(_output(parse(data)))
    if run:
        _merge_run(run, parse, outs)
    return outs


def _merge_run(run: list[bytes], parse: Any, outs: list[WorkerOutput]) -> None:
    if len(run) < 3:
        outs.extend(_output(parse(data)) for data in run)
        return
    ids: list[int] = []
    cached = 0
    c: Any = None
    for data in run[:-1]:
        c = parse(data).chunk
        if c.index:  # choice 0 is the only one: a message for another goes through the contract alone
            outs.extend(_output(parse(d)) for d in run)
            return
        ids += c.token_ids
        cached = max(cached, c.cached_tokens)  # as the Output stage keeps the largest report
    outs.append(WorkerOutput(0, ids, c.prompt_tokens, c.completion_tokens, cached))
    outs.append(_output(parse(run[-1])))


def _failed(url: str, what: str, status: str, details: str) -> WorkerFailed:
    kind: type[WorkerFailed] = WorkerFailed
    if status in REQUEST_FAULT_STATUSES:
        kind = WorkerRejected
    elif status == UNAVAILABLE_STATUS:
        kind = WorkerUnavailable
    return kind(f"worker {url}: {what} failed: {status}: {details}".rstrip(": "))


def _rpc_error(url: str, what: str, exc: grpc.aio.AioRpcError) -> WorkerFailed:
    return _failed(url, what, exc.code().name, exc.details() or "")


def _call_error(url: str, what: str, exc: CallFailed) -> WorkerFailed:
    """The same error as ``_rpc_error`` for the same status, whichever transport carried the call."""
    return _failed(url, what, exc.status.name, exc.status.message)


@dataclass(slots=True)
class _Endpoint:
    """The channels of one set of checked addresses."""

    channel: grpc.aio.Channel
    stub: Any
    h2: H2GenerateChannel | None

    async def close(self) -> None:
        if self.h2 is not None:
            await self.h2.close()
        await self.channel.close(grace=None)


_TOKENIZED_TAG: Final = field_tag(pb.GenerateRequest.DESCRIPTOR.fields_by_name["tokenized"].number)
_INPUT_IDS_TAG: Final = field_tag(pb.TokenizedInput.DESCRIPTOR.fields_by_name["input_ids"].number)


def _tokenized_field(ids: Sequence[int]) -> tuple[bytes, ...] | None:
    """The serialized ``tokenized`` field of a GenerateRequest for a prompt held as an array of 32-bit ids
    (the tokenizer's; `packed_ids`), in pieces to join; None for any other prompt (protobuf writes those)."""
    if not isinstance(ids, array):
        return None
    packed = packed_uint32(ids)
    if packed is None:
        return None
    if not packed:
        return (_TOKENIZED_TAG, b"\x00")  # present and empty
    head = _INPUT_IDS_TAG + varint(len(packed))
    return (_TOKENIZED_TAG, varint(len(head) + len(packed)), head, packed)


class VllmGrpcClient:
    """WorkerClient for a worker speaking VllmEngine (vLLM's gRPC servicer, or our simulated engine).

    A worker addressed by name is resolved by us (``worker_address``) and its channels pinned to the checked
    addresses; the name is resolved again on a health check once ``REFRESH_S`` passed (or after a failed one),
    new addresses get new channels (the old ones serve their running calls for ``RETIRE_GRACE_S``), and an
    answer naming an address outside the network policy takes the worker out (every call fails UNAVAILABLE
    naming it) until the name leads somewhere allowed again.
    """

    def __init__(
        self,
        url: str,
        *,
        generate_transport: GenerateTransport = DEFAULT_GENERATE_TRANSPORT,
        channel: ChannelConfig | None = None,
        policy: NetworkPolicy | None = None,
        resolve: Resolver = system_resolve,
        refresh_s: float = REFRESH_S,
    ) -> None:
        """``grpcs://`` URLs use TLS (``channel.tls``); ``policy`` bounds where a name may lead (default: the
        denied ranges only); ``resolve`` looks the name up again on health checks ``refresh_s`` apart.
        Raises ValueError on a bad URL."""
        self._url = url
        self._target = parse_target(url)
        self._config = channel or ChannelConfig()
        self._transport = generate_transport
        self._policy = policy or NetworkPolicy()
        self._resolve = resolve
        self._refresh_s = refresh_s
        self._lock = asyncio.Lock()
        self._refused = ""  # why the name's current addresses are refused; "" when they are not
        self._resolved_at = -math.inf
        self._retiring: set[asyncio.Task[None]] = set()
        self._pinned: PinnedTarget | None = None
        self._ep: _Endpoint | None = None
        if self._target.ip is not None:  # an IP literal: checked at registration, nothing to resolve
            self._pinned = PinnedTarget(self._target, (self._target.ip,))
            self._ep = self._open(self._pinned)

    def _open(self, pinned: PinnedTarget) -> _Endpoint:
        target, config = self._target, self._config
        # When the health checks take the h2 connection (``_CHECKS_OVER_H2``) this channel idles between the rare
        # calls it still carries (GetModelInfo, Abort, the KV-event stream), so it sends no pings without calls.
        options = config.grpc_options(
            MAX_MESSAGE_BYTES, ping_without_calls=self._transport != "h2" or not _CHECKS_OVER_H2
        )
        grpc_target = target.authority
        if target.ip is None:
            grpc_target = pinned.grpc_target()
            options.append(("grpc.default_authority", target.authority))
            if target.tls and not config.tls.server_name:
                options.append(("grpc.ssl_target_name_override", target.host))
        if target.tls:
            channel = grpc.aio.secure_channel(grpc_target, config.tls.grpc_credentials(), options=options)
        else:
            channel = grpc.aio.insecure_channel(grpc_target, options=options)
        h2 = (
            H2GenerateChannel(
                target.authority,
                max_message_bytes=MAX_MESSAGE_BYTES,
                keepalive=config.keepalive,
                ssl=config.tls.ssl_context() if target.tls else None,
                server_name=config.tls.server_name or target.host,
                connect_host=pinned.first,
            )
            if self._transport == "h2"
            else None
        )
        return _Endpoint(channel, pb_grpc.VllmEngineStub(channel), h2)

    async def _endpoint(self, *, refresh: bool = False) -> _Endpoint:
        """The channels to use now. A name is resolved on first use, and with ``refresh`` (health checks)
        again when due. Raises WorkerUnavailable when the name leads nowhere allowed."""
        if self._target.ip is None and (refresh or (self._ep is None and not self._refused)):
            await self._refresh()
        if self._ep is None:
            raise WorkerUnavailable(f"worker {self._url}: {self._refused or 'not resolved yet'}")
        return self._ep

    async def _refresh(self) -> None:
        async with self._lock:
            now = asyncio.get_running_loop().time()
            if self._ep is not None and now - self._resolved_at < self._refresh_s:
                return  # fresh enough (or resolved by the call this one waited for)
            self._resolved_at = now
            try:
                pinned = await checked_addresses(self._url, self._target, self._policy, resolve=self._resolve)
            except WorkerUnresolved as exc:
                if self._ep is None:
                    self._refused = str(exc)
                return  # a DNS outage: keep the addresses checked before
            except WorkerAddressError as exc:
                if str(exc) != self._refused:
                    log.warning("worker %s refused: %s", self._url, exc)
                self._refused = str(exc)
                if self._ep is not None:  # the name now leads somewhere forbidden: nothing more goes there
                    ep, self._ep, self._pinned = self._ep, None, None
                    await ep.close()
                return
            if self._refused:
                log.info("worker %s: %s resolves to allowed addresses", self._url, self._target.host)
            self._refused = ""
            if self._ep is not None and self._pinned is not None and self._pinned.addresses == pinned.addresses:
                return
            old, self._ep, self._pinned = self._ep, self._open(pinned), pinned
            if old is not None:
                log.info(
                    "worker %s: %s moved to %s", self._url, self._target.host, ", ".join(map(str, pinned.addresses))
                )
                task = asyncio.get_running_loop().create_task(self._retire(old))
                self._retiring.add(task)
                task.add_done_callback(self._retiring.discard)

    async def _retire(self, ep: _Endpoint) -> None:
        try:
            await asyncio.sleep(RETIRE_GRACE_S)  # calls running on the old addresses finish there
        finally:
            await ep.close()

    @property
    def url(self) -> str:
        return self._url

    async def model_info(self, *, timeout_s: float) -> ModelInfo:
        stub = (await self._endpoint()).stub
        try:
            r = await stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(self._url, "GetModelInfo", exc) from exc
        return ModelInfo(
            served_model_name=r.served_model_name,
            model_path=r.model_path,
            max_context_length=r.max_context_length,
            vocab_size=r.vocab_size,
            eos_token_ids=tuple(r.eos_token_ids),
            bos_token_id=r.bos_token_id if r.bos_token_id > 0 else None,
            model_type=r.model_type,
            architectures=tuple(r.architectures),
        )

    async def health(self, *, timeout_s: float) -> bool:
        try:
            ep = await self._endpoint(refresh=True)
            if ep.h2 is not None and _CHECKS_OVER_H2:
                data = await ep.h2.unary(_HEALTH_PATH, _HEALTH_REQUEST, timeout_s=timeout_s)
                return bool(pb.HealthCheckResponse.FromString(data).healthy)
            r = await ep.stub.HealthCheck(pb.HealthCheckRequest(), timeout=timeout_s)
        except WorkerUnavailable:
            return False
        except (grpc.aio.AioRpcError, CallFailed, DecodeError):
            self._resolved_at = -math.inf  # a failed check asks the resolver again next time
            return False
        return bool(r.healthy)

    def generate(self, request: WorkerRequest) -> AsyncGenerator[WorkerOutput, None]:
        return flattened(self.generate_batches(request))

    async def generate_batches(self, request: WorkerRequest) -> AsyncGenerator[list[WorkerOutput], None]:
        """Generate's messages, every message that arrived together as one list (always one with grpc.aio)."""
        msg = pb.GenerateRequest(
            request_id=request.request_id,
            sampling_params=_sampling_params(request.params),
            stream=request.stream,
        )
        if request.kv_transfer_params_json is not None:
            msg.kv_transfer_params_json = request.kv_transfer_params_json
        ep = await self._endpoint()
        tokenized = _tokenized_field(request.prompt_ids) if ep.h2 is not None else None
        if tokenized is None:
            # Filled in place: a TokenizedInput built apart is copied into the request again (~60 µs per 7,800
            # ids, a tenth of the message's cost); the serialized bytes are the same.
            msg.tokenized.SetInParent()  # present even for an empty prompt
            msg.tokenized.input_ids.extend(request.prompt_ids)
        if ep.h2 is not None:
            # The tokenized field after the rest: a parser takes a message's fields in any order.
            body = msg.SerializeToString() if tokenized is None else b"".join((msg.SerializeToString(), *tokenized))
            parse = pb.GenerateResponse.FromString
            merge = request.params.n == 1 and request.params.logprobs is None
            push = request.push
            failed: list[Exception] = []  # what the push raised (a bug): raised here, to the reader
            raw_push: RawPush | None = None
            if push is not None:

                def raw_push(raw: list[bytes]) -> Pushed:
                    if failed:
                        return Pushed.DECLINED
                    try:
                        outs = _outputs(raw, parse, merge)
                    except DecodeError:
                        return Pushed.DECLINED  # the reader parses it again and fails the call
                    try:
                        return push(outs)
                    except Exception as exc:
                        failed.append(exc)
                        return Pushed.TAKEN_WAKE

            calls = ep.h2.call(_GENERATE_PATH, body, metadata=request.trace_headers, push=raw_push)
            try:
                async for batch in calls:
                    if not batch:  # the push asked its reader to look: pass the empty batch on
                        if failed:
                            raise failed[0]
                        yield []
                        continue
                    yield _outputs(batch, parse, merge)
            except CallFailed as exc:
                raise _call_error(self._url, "Generate", exc) from exc
            except DecodeError as exc:  # what grpc.aio reports as INTERNAL for an unparsable message
                raise WorkerFailed(f"worker {self._url}: Generate failed: INTERNAL: {exc}") from exc
            finally:
                await calls.aclose()  # early exit: RST_STREAM now; the caller also sends Abort
            return
        call = ep.stub.Generate(msg, metadata=request.trace_headers or None)
        try:
            # read() rather than `async for`: one async-generator layer less per message on the hot path.
            while (resp := await call.read()) is not _EOF:
                if resp is None:  # grpc.aio logs the DecodeError and hands back None for an unparsable message
                    raise WorkerFailed(f"worker {self._url}: Generate failed: INTERNAL: an unparsable message")
                yield [_output(resp)]
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(self._url, "Generate", exc) from exc
        finally:
            # Early exit (stop string, client gone): end the RPC now; the caller also sends Abort.
            call.cancel()

    async def loads(self, *, timeout_s: float) -> EngineLoad | None:
        """The engine's load (GetLoads); None when the worker does not implement it. A health check's RPC (often
        its only one): a named worker is looked up again when due, and after a failure."""
        ep = await self._endpoint(refresh=True)
        if ep.h2 is not None and _CHECKS_OVER_H2:
            try:
                data = await ep.h2.unary(_LOADS_PATH, _LOADS_REQUEST, timeout_s=timeout_s)
                return convert_get_loads(pb.GetLoadsResponse.FromString(data))
            except CallFailed as exc:
                if exc.status.code == UNIMPLEMENTED:
                    return None
                self._resolved_at = -math.inf  # a failed check asks the resolver again next time
                raise _call_error(self._url, "GetLoads", exc) from exc
            except DecodeError as exc:
                raise WorkerFailed(f"worker {self._url}: GetLoads failed: INTERNAL: {exc}") from exc
        try:
            r = await ep.stub.GetLoads(pb.GetLoadsRequest(), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            self._resolved_at = -math.inf
            raise _rpc_error(self._url, "GetLoads", exc) from exc
        return convert_get_loads(r)

    async def kv_events(
        self, start_sequence_number: int
    ) -> AsyncGenerator[tuple[KvEventBatch | None, EngineLoad | None], None]:
        """SubscribeKvEvents: (batch, load record) pairs; the batch is None for a load-only record, and the
        first pair is (None, None) once the worker has answered with its headers: the subscription is open.

        That first pair matters because an engine may send nothing until its cache changes (smg-grpc-servicer
        relays vLLM's events and sends no heartbeat before the first batch), and events published before the
        subscription opened are not replayed: without it, an open but quiet stream looks like no stream at all.

        Raises KvEventsUnsupported when the worker does not publish KV events, WorkerFailed otherwise.
        """
        request = common_pb2.SubscribeKvEventsRequest(
            start_sequence_number=start_sequence_number, load_records_before_first_batch=True
        )
        call = (await self._endpoint()).stub.SubscribeKvEvents(request)
        try:
            await call.initial_metadata()
            if not call.done():  # a refusal (UNIMPLEMENTED) comes as headers and status at once
                yield None, None
            async for b in call:
                load = convert_load_record(b.load) if b.HasField("load") else None
                only_load = b.HasField("load") and b.load.load_only
                yield (None if only_load else convert_batch(b)), load
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise KvEventsUnsupported(f"worker {self._url} publishes no KV events") from exc
            raise _rpc_error(self._url, "SubscribeKvEvents", exc) from exc
        finally:
            call.cancel()

    async def abort(self, request_ids: Sequence[str], *, timeout_s: float) -> None:
        stub = (await self._endpoint()).stub
        try:
            await stub.Abort(pb.AbortRequest(request_ids=list(request_ids)), timeout=timeout_s)
        except grpc.aio.AioRpcError as exc:
            raise _rpc_error(self._url, "Abort", exc) from exc

    async def connection_lost(self) -> None:
        """The control channel (grpc.aio: health checks, GetModelInfo, Abort) leaving READY: the worker closed
        the connection (it exited, or sent GOAWAY) or its keepalive failed. Event-driven: no cost while up."""
        while True:
            ep = await self._endpoint()
            state = ep.channel.get_state(try_to_connect=False)
            if state == grpc.ChannelConnectivity.SHUTDOWN:
                raise WorkerUnavailable(f"worker {self._url}: the client is closed")
            await ep.channel.wait_for_state_change(state)
            if state == grpc.ChannelConnectivity.READY and ep is self._ep:
                return
            # Not up yet (or the name moved to new channels): watch again from the state it is in now.

    async def close(self) -> None:
        for task in list(self._retiring):
            task.cancel()
        await asyncio.gather(*self._retiring, return_exceptions=True)
        if self._ep is not None:
            await self._ep.close()
