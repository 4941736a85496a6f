"""POST /v1/completions: a prompt as text or token ids (or a batch of either), answered as OpenAI does."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
from aiohttp import web

from node.errors import GatewayError, InvalidRequest
from node.http import openai_common as common
from node.http.errors import error_object, read_json
from node.http.openai_types import CompletionRequest
from node.http.sse import ChunkFrames, SseStream, frame, open_stream
from node.pipeline.generate import GenerateSpec, Generation, TextDelta, Usage
from node.pipeline.served_model import ServedModel


@dataclass(frozen=True, slots=True)
class _Prompt:
    ids: list[int]
    text: str | None  # known for text prompts; decoded lazily for echo of token prompts


def _prompts(req: CompletionRequest, model: ServedModel) -> list[_Prompt | str]:
    """Split `prompt` (str | list[str] | list[int] | list[list[int]]) into prompts; text is encoded later."""
    p = req.prompt
    if isinstance(p, str):
        return [p]
    if not p:
        raise InvalidRequest("'prompt' must not be empty.", param="prompt")
    vocab = model.tokenizer.vocab_size

    def ids_of(items: Sequence[Any], where: str) -> _Prompt:
        if not items:
            raise InvalidRequest("A token prompt must not be empty.", param=where)
        for t in items:
            if isinstance(t, bool) or not isinstance(t, int) or not 0 <= t < vocab:
                raise InvalidRequest(f"Token ids in '{where}' must be integers in [0, {vocab}).", param=where)
        return _Prompt(ids=list(items), text=None)

    if all(isinstance(x, str) for x in p):
        out: list[_Prompt | str] = list(p)
    elif all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        out = [ids_of(p, "prompt")]
    elif all(isinstance(x, list) for x in p):
        out = [ids_of(x, f"prompt[{i}]") for i, x in enumerate(p)]
    else:
        raise InvalidRequest(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists.",
            param="prompt",
        )
    return out  # how many: RequestLimits.max_prompts, checked at decode


async def _merge(gens: list[Generation]) -> AsyncGenerator[tuple[int, list[TextDelta]], None]:
    """Interleave several generations' delta batches as they come; yields (generation index, batch)."""
    if len(gens) == 1:
        async with contextlib.aclosing(gens[0].deltas()) as it:
            async for batch in it:
                yield 0, batch
        return
    queue: asyncio.Queue[tuple[int, list[TextDelta]] | tuple[int, BaseException | None]] = asyncio.Queue()

    async def pump(k: int, gen: Generation) -> None:
        try:
            async with contextlib.aclosing(gen.deltas()) as it:
                async for batch in it:
                    await queue.put((k, batch))
            await queue.put((k, None))
        except Exception as exc:
            await queue.put((k, exc))

    tasks = [asyncio.create_task(pump(k, g), name=f"completion-{k}") for k, g in enumerate(gens)]
    try:
        remaining = len(gens)
        while remaining:
            k, item = await queue.get()
            if item is None:
                remaining -= 1
            elif isinstance(item, BaseException):
                raise item
            else:
                yield k, item
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


class Completions(common.GenerationApi):
    async def handle(self, request: web.Request) -> web.StreamResponse:
        req = await read_json(request, CompletionRequest, self._max_body)
        return await self._peer_for(req.model)._serve(request, req)

    async def _serve(self, request: web.Request, req: CompletionRequest) -> web.StreamResponse:
        model = self._model
        common.check_model(req.model, model)
        common.validate_sampling(req, model)
        if req.suffix:
            raise InvalidRequest("'suffix' is not supported by this model.", param="suffix")
        if req.best_of is not None and req.best_of != req.n:
            raise InvalidRequest("'best_of' must equal 'n' (server-side best-of is not supported).", param="best_of")
        if req.logprobs is not None and req.logprobs < 0:  # upper bound: RequestLimits.max_top_logprobs
            raise InvalidRequest("'logprobs' must be >= 0.", param="logprobs")
        stops = common.stop_strings(req)
        prompts = [
            _Prompt(ids=await self._cpu.encode(model.tokenizer, p, add_special_tokens=True), text=p)
            if isinstance(p, str)
            else p
            for p in _prompts(req, model)
        ]
        gens: list[Generation] = []
        rid = common.new_id("cmpl")
        cap = self._limits.output_cap(req.n * len(prompts), logprobs=req.logprobs is not None)
        for k, prompt in enumerate(prompts):
            max_tokens = common.resolve_max_tokens(
                req.max_tokens, len(prompt.ids), model, param="max_tokens", prompt_param="prompt", cap=cap
            )
            params = common.sampling_params(req, model, max_tokens=max_tokens, logprobs=req.logprobs)
            spec = GenerateSpec(
                model=self._model.name,
                request_id=rid if len(prompts) == 1 else f"{rid}-{k}",
                prompt_ids=prompt.ids,
                params=params,
                stops=stops,
                include_stop_str=req.include_stop_str_in_output,
                terminators=common.terminators(req, model),
                routing_key=request.headers.get(self._routing_key_header),
                want_token_ids=req.logprobs is not None,
                client_stream=req.stream,
            )
            gens.append(Generation(spec, pool=self._pool, tokenizer=model.tokenizer))
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            return await self._stream(request, req, prompts, gens, rid, include_usage=include_usage)
        return await self._complete(req, prompts, gens, rid)

    def _echo(self, prompt: _Prompt) -> str:
        return (
            prompt.text
            if prompt.text is not None
            else self._model.tokenizer.decode(prompt.ids, skip_special_tokens=False)
        )

    def _logprobs(self, deltas: list[TextDelta], offset: int) -> dict[str, Any]:
        tokens: list[str] = []
        values: list[float] = []
        tops: list[dict[str, float]] = []
        offsets: list[int] = []
        for d in deltas:
            for lp in d.logprobs:
                tok = self._token_text(lp.token_id)
                offsets.append(offset)
                offset += len(tok)
                tokens.append(tok)
                values.append(lp.logprob)
                tops.append({self._token_text(t): v for t, v in lp.top})
        return {"tokens": tokens, "token_logprobs": values, "top_logprobs": tops, "text_offset": offsets}

    @staticmethod
    def _usage(gens: list[Generation]) -> Usage:
        total = Usage(prompt_tokens=0)
        for g in gens:
            total.prompt_tokens += g.usage.prompt_tokens
            total.completion_tokens += g.usage.completion_tokens
            total.cached_tokens += g.usage.cached_tokens
        return total

    async def _complete(
        self, req: CompletionRequest, prompts: list[_Prompt], gens: list[Generation], rid: str
    ) -> web.Response:
        n = req.n
        count = n * len(gens)
        collected: list[list[TextDelta]] = [[] for _ in range(count)]
        async with contextlib.aclosing(_merge(gens)) as merged:
            async for k, batch in merged:
                for d in batch:
                    collected[k * n + d.index].append(d)
        choices = []
        for c in range(count):
            prompt = prompts[c // n]
            prefix = self._echo(prompt) if req.echo else ""
            deltas = collected[c]
            choices.append(
                {
                    "text": prefix + "".join(d.text for d in deltas),
                    "index": c,
                    "logprobs": self._logprobs(deltas, len(prefix)) if req.logprobs is not None else None,
                    "finish_reason": next((d.finish_reason for d in deltas if d.finish_reason), None),
                }
            )
        usage = self._usage(gens)
        self._on_usage(usage)
        body = {
            "id": rid,
            "object": "text_completion",
            "created": common.now_s(),
            "model": self._model.name,
            "choices": choices,
            "usage": common.usage_dict(usage),
            "system_fingerprint": None,
        }
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")

    async def _stream(
        self,
        request: web.Request,
        req: CompletionRequest,
        prompts: list[_Prompt],
        gens: list[Generation],
        rid: str,
        *,
        include_usage: bool,
    ) -> web.StreamResponse:
        frames = ChunkFrames(
            response_id=rid,
            obj="text_completion",
            created=common.now_s(),
            model=self._model.name,
            include_usage=include_usage,
        )
        n = req.n
        async with contextlib.aclosing(_merge(gens)) as merged:
            first = await anext(merged, None)  # errors before the first token stay plain HTTP errors
            resp = await open_stream(request)
            out = SseStream(resp)
            if req.echo:
                for c in range(n * len(gens)):
                    out.add(frames.completion_text(c, self._echo(prompts[c // n])))
            open_choices = n * len(gens)
            try:
                item = first
                while item is not None:
                    k, batch = item
                    for d in batch:
                        index = k * n + d.index
                        if d.finish_reason is None and req.logprobs is None:
                            out.add(frames.completion_text(index, d.text))
                            continue
                        out.add(
                            frames.with_choice(
                                {
                                    "index": index,
                                    "text": d.text,
                                    "logprobs": self._logprobs([d], 0) if req.logprobs is not None else None,
                                    "finish_reason": d.finish_reason,
                                }
                            )
                        )
                        if d.finish_reason is not None:
                            open_choices -= 1
                    if open_choices:
                        await out.flush()
                    # else every choice has ended: what is left goes out with [DONE] in the closing write.
                    item = await anext(merged, None)
            except GatewayError as exc:
                out.add(frame({"error": error_object(exc)}))
                await out.close()
                return resp
        usage = self._usage(gens)
        self._on_usage(usage)
        if include_usage:
            out.add(frames.usage(common.usage_dict(usage)))
        await out.close()
        return resp
