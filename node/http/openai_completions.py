"""The OpenAI Completions adapter: POST /v1/completions, a prompt as text or token ids (or a batch of
either; the pipeline fans a batch out), answered as OpenAI does."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Any

import msgspec
from aiohttp import web

from node.errors import GatewayError, InvalidRequest
from node.http import openai_common as common
from node.http.adapter import Route
from node.http.errors import error_object, read_json
from node.http.middleware import context_of
from node.http.openai_types import CompletionRequest
from node.http.sse import ChunkFrames, SseSink, SseStream, frame, open_stream
from node.pipeline.events import ContentDelta, Event, Finish, Usage
from node.pipeline.request import GenerateRequest, TextPrompt, TokenPrompt
from node.pipeline.run import Run
from node.pipeline.served_model import ServedModel
from node.pipeline.spec import Prepared, PreparedPrompt


def _prompts(req: CompletionRequest) -> tuple[TextPrompt | TokenPrompt, ...]:
    """Split `prompt` (str | list[str] | list[int] | list[list[int]]) into prompts (token ids are checked
    against the vocabulary by Prepare)."""
    p = req.prompt
    if isinstance(p, str):
        return (TextPrompt(p),)
    if not p:
        raise InvalidRequest("'prompt' must not be empty.", param="prompt")
    out: list[TextPrompt | TokenPrompt]
    if all(isinstance(x, str) for x in p):
        out = [TextPrompt(x) for x in p]
    elif all(isinstance(x, int) and not isinstance(x, bool) for x in p):
        out = [TokenPrompt(p, "prompt")]
    elif all(isinstance(x, list) for x in p):
        out = [TokenPrompt(x, f"prompt[{i}]") for i, x in enumerate(p)]
    else:
        raise InvalidRequest(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists.",
            param="prompt",
        )
    return tuple(out)  # how many: RequestLimits.max_prompts, checked at decode


def completion_request(req: CompletionRequest) -> GenerateRequest:
    """The neutral request of a completion. Raises InvalidRequest naming the field."""
    if req.suffix:
        raise InvalidRequest("'suffix' is not supported by this model.", param="suffix")
    if req.best_of is not None and req.best_of != req.n:
        raise InvalidRequest("'best_of' must equal 'n' (server-side best-of is not supported).", param="best_of")
    if req.logprobs is not None and req.logprobs < 0:  # upper bound: RequestLimits.max_top_logprobs
        raise InvalidRequest("'logprobs' must be >= 0.", param="logprobs")
    constrained = common.output_constraint(req)
    return GenerateRequest(
        model=req.model,
        prompts=_prompts(req),
        sampling=common.sampling_of(req, max_tokens=req.max_tokens, logprobs=req.logprobs),
        stream=req.stream,
        want_token_ids=req.logprobs is not None,
        budget_param="max_tokens",
        prompt_param="prompt",
        constraint=constrained.constraint if constrained is not None else None,
    )


class Completions(common.OpenAIAdapter):
    def routes(self) -> list[Route]:
        return [Route("POST", "/v1/completions", self.handle)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ctx = context_of(request)
        req = await read_json(request, CompletionRequest, self._max_body)
        pipeline = self._pipeline
        model = pipeline.model(req.model)
        neutral = completion_request(req)
        rid = common.new_id("cmpl")
        prepared = await pipeline.prepare(neutral, model, ctx, request_id=rid)
        run = pipeline.run(prepared, ctx)
        view = _CompletionView(rid, model, self._token_texts[model.name], req, prepared)
        if req.stream:
            return await view.stream(request, run)
        return await view.complete(run)


class _CompletionView:
    """Renders one request's events as OpenAI text_completion JSON or SSE."""

    def __init__(
        self, rid: str, model: ServedModel, token_text: common.TokenText, req: CompletionRequest, prepared: Prepared
    ) -> None:
        self._rid = rid
        self._model = model
        self._token_text = token_text
        self._req = req
        self._prompts = prepared.prompts
        self._count = req.n * len(prepared.prompts)

    def _echo(self, prompt: PreparedPrompt) -> str:
        if prompt.text is not None:
            return prompt.text
        return self._model.tokenizer.decode(list(prompt.ids), skip_special_tokens=False)

    def _logprobs(self, deltas: Sequence[ContentDelta], offset: int) -> dict[str, Any]:
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

    async def complete(self, run: Run) -> web.Response:
        req = self._req
        collected: list[list[ContentDelta]] = [[] for _ in range(self._count)]
        reasons: list[str | None] = [None] * self._count
        usage = run.usage
        async with contextlib.aclosing(run.events()) as events:
            async for batch in events:
                for ev in batch:
                    if type(ev) is ContentDelta:
                        collected[ev.index].append(ev)
                    elif type(ev) is Finish:
                        reasons[ev.index] = ev.reason
                    elif type(ev) is Usage:
                        usage = ev
        choices = []
        for c in range(self._count):
            prefix = self._echo(self._prompts[c // req.n]) if req.echo else ""
            deltas = collected[c]
            choices.append(
                {
                    "text": prefix + "".join(d.text for d in deltas),
                    "index": c,
                    "logprobs": self._logprobs(deltas, len(prefix)) if req.logprobs is not None else None,
                    "finish_reason": reasons[c],
                }
            )
        body = {
            "id": self._rid,
            "object": "text_completion",
            "created": common.now_s(),
            "model": self._model.name,
            "choices": choices,
            "usage": common.usage_dict(usage),
            "system_fingerprint": None,
        }
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")

    async def stream(self, request: web.Request, run: Run) -> web.StreamResponse:
        req = self._req
        include_usage = common.include_usage(req)
        frames = ChunkFrames(
            response_id=self._rid,
            obj="text_completion",
            created=common.now_s(),
            model=self._model.name,
            include_usage=include_usage,
        )
        sink = _CompletionSink(self, frames, run.usage)
        async with contextlib.aclosing(run.events(sink=sink)) as events:
            first = await anext(events, None)  # errors before the first token stay plain HTTP errors
            resp = await open_stream(request)
            out = sink.out = SseStream(resp)
            if req.echo:
                for c in range(self._count):
                    out.add(frames.completion_text(c, self._echo(self._prompts[c // req.n])))
            try:
                batch = first
                while batch is not None:
                    sink.render(batch)
                    if sink.open_choices:
                        await out.flush()
                    # else every choice has ended: what is left goes out with [DONE] in the closing write.
                    # From the first flush on, the tokens that need no waiting arrive by push (sink.take)
                    # while this task waits here; __anext__ itself, not anext(events, None): that wraps
                    # every step in one more awaitable.
                    try:
                        batch = await events.__anext__()
                    except StopAsyncIteration:
                        batch = None
            except GatewayError as exc:
                out.add(frame({"error": error_object(exc)}))
                await out.close()
                return resp
        if include_usage:
            out.add(frames.usage(common.usage_dict(sink.usage)))
        await out.close()
        return resp

    def _frame(
        self, frames: ChunkFrames, index: int, deltas: Sequence[ContentDelta], finish_reason: str | None
    ) -> bytes:
        return frames.with_choice(
            {
                "index": index,
                "text": "".join(d.text for d in deltas),
                "logprobs": self._logprobs(deltas, 0) if self._req.logprobs is not None else None,
                "finish_reason": finish_reason,
            }
        )


class _CompletionSink(SseSink):
    __slots__ = ("_frames", "_view")

    def __init__(self, view: _CompletionView, frames: ChunkFrames, usage: Usage) -> None:
        super().__init__(view._count, usage)
        self._view = view
        self._frames = frames

    def render(self, batch: list[Event]) -> None:
        out = self.out
        assert out is not None
        frames, view = self._frames, self._view
        plain = view._req.logprobs is None
        for k, ev in enumerate(batch):
            if type(ev) is ContentDelta:
                if _finishes_next(batch, k, ev.index):
                    continue  # its text goes out in the choice's last frame, with the reason
                if plain:
                    out.add(frames.completion_text(ev.index, ev.text))
                else:
                    out.add(view._frame(frames, ev.index, (ev,), None))
            elif type(ev) is Finish:
                last = batch[k - 1] if k else None
                tail = (last,) if type(last) is ContentDelta and last.index == ev.index else ()
                out.add(view._frame(frames, ev.index, tail, ev.reason))
                self.open_choices -= 1
            elif type(ev) is Usage:
                self.usage = ev


def _finishes_next(batch: Sequence[Event], k: int, index: int) -> bool:
    """Whether the event after ``batch[k]`` ends choice ``index`` (the delta then rides in its frame)."""
    if k + 1 >= len(batch):
        return False
    nxt = batch[k + 1]
    return type(nxt) is Finish and nxt.index == index
