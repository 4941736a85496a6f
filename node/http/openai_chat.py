"""The OpenAI Chat Completions adapter: POST /v1/chat/completions parsed into the neutral request, the
pipeline's events rendered as OpenAI's chat.completion JSON or chat.completion.chunk SSE."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
from aiohttp import web

from node.errors import GatewayError, InvalidRequest
from node.http import openai_common as common
from node.http.adapter import Route
from node.http.errors import error_object, read_json
from node.http.middleware import context_of
from node.http.openai_types import ChatCompletionRequest, ChatMessage
from node.http.sse import ChunkFrames, SseSink, SseStream, frame, open_stream
from node.pipeline.events import ContentDelta, Event, Finish, ReasoningDelta, ToolCallDelta, Usage
from node.pipeline.request import ChatPrompt, GenerateRequest
from node.pipeline.run import Run


def _content_text(msg: ChatMessage, index: int) -> str | None:
    if msg.content is None or isinstance(msg.content, str):
        return msg.content
    texts: list[str] = []
    for k, part in enumerate(msg.content):
        if part.type not in ("text", "input_text"):
            raise InvalidRequest(
                f"Content parts of type '{part.type}' are not supported by this model; only 'text' is.",
                param=f"messages[{index}].content[{k}].type",
            )
        if part.text is None:
            raise InvalidRequest("A text content part needs 'text'.", param=f"messages[{index}].content[{k}].text")
        texts.append(part.text)
    return "\n".join(texts)


def _arguments(raw: str) -> Any:
    """Templates expect tool-call arguments as a mapping (they `tojson` them); invalid JSON stays text."""
    try:
        return msgspec.json.decode(raw)
    except msgspec.DecodeError:
        return raw


def template_messages(messages: list[ChatMessage]) -> list[dict[str, Any]]:
    """Messages in the shape Hugging Face chat templates read. Raises InvalidRequest naming the field."""
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message.", param="messages")
    out: list[dict[str, Any]] = []
    for i, msg in enumerate(messages):
        item: dict[str, Any] = {"role": msg.role, "content": _content_text(msg, i)}
        if msg.role in ("system", "developer", "user") and item["content"] is None:
            raise InvalidRequest(f"A {msg.role} message needs 'content'.", param=f"messages[{i}].content")
        if msg.name is not None:
            item["name"] = msg.name
        if msg.reasoning_content is not None and msg.role == "assistant":
            item["reasoning_content"] = msg.reasoning_content
        if msg.tool_calls:
            if msg.role != "assistant":
                raise InvalidRequest("Only assistant messages may carry 'tool_calls'.", param=f"messages[{i}]")
            item["tool_calls"] = [
                {
                    "id": tc.id,
                    "type": tc.type,
                    "function": {"name": tc.function.name, "arguments": _arguments(tc.function.arguments)},
                }
                for tc in msg.tool_calls
            ]
        if msg.role == "tool":
            if msg.tool_call_id is None:
                raise InvalidRequest("A tool message needs 'tool_call_id'.", param=f"messages[{i}].tool_call_id")
            item["tool_call_id"] = msg.tool_call_id
        out.append(item)
    return out


def chat_request(req: ChatCompletionRequest) -> GenerateRequest:
    """The neutral request of a chat completion. Raises InvalidRequest naming the field."""
    if req.top_logprobs is not None:
        if not req.logprobs:
            raise InvalidRequest("'top_logprobs' requires 'logprobs' to be true.", param="top_logprobs")
        if req.top_logprobs < 0:  # the upper bound is RequestLimits.max_top_logprobs, checked at decode
            raise InvalidRequest("'top_logprobs' must be >= 0.", param="top_logprobs")
    if req.continue_final_message and req.add_generation_prompt:
        raise InvalidRequest(
            "'continue_final_message' and 'add_generation_prompt' cannot both be true.",
            param="continue_final_message",
        )
    if req.thinking_token_budget is not None and req.thinking_token_budget < 1:
        raise InvalidRequest("'thinking_token_budget' must be >= 1.", param="thinking_token_budget")
    use_completion_tokens = req.max_completion_tokens is not None
    schemas: dict[str, dict[str, Any]] = {}
    for k, tool in enumerate(req.tools or ()):
        if tool.function.name in schemas:
            raise InvalidRequest(f"Two tools are named {tool.function.name!r}.", param=f"tools[{k}].function.name")
        schemas[tool.function.name] = tool.function.parameters or {}
    tools = common.tool_use(schemas, req.tool_choice, parallel=req.parallel_tool_calls, api="chat")
    offered = tools is not None and tools.choice != "none"
    listed = [msgspec.to_builtins(t) for t in req.tools] if req.tools else None
    # tool_choice required / a named function: the engine is constrained to call (node.pipeline.constraints).
    constrained = common.output_constraint(req, tools=listed, tool_choice=req.tool_choice)
    prompt = ChatPrompt(
        messages=template_messages(req.messages),
        # tool_choice "none": the tools are not offered to the model at all.
        tools=listed if offered else None,
        add_generation_prompt=req.add_generation_prompt,
        continue_final_message=req.continue_final_message,
        template_kwargs=req.chat_template_kwargs,
        no_template_hint="use /v1/completions or start the node with --chat-template.",
    )
    return GenerateRequest(
        model=req.model,
        prompts=(prompt,),
        sampling=common.sampling_of(
            req,
            max_tokens=req.max_completion_tokens if use_completion_tokens else req.max_tokens,
            logprobs=(req.top_logprobs or 0) if req.logprobs else None,
        ),
        stream=req.stream,
        budget_param="max_completion_tokens" if use_completion_tokens else "max_tokens",
        prompt_param="messages",
        tools=tools,
        constraint=constrained.constraint if constrained is not None else None,
        reasoning_budget=req.thinking_token_budget,
    )


class ChatCompletions(common.OpenAIAdapter):
    def routes(self) -> list[Route]:
        return [Route("POST", "/v1/chat/completions", self.handle)]

    async def handle(self, request: web.Request) -> web.StreamResponse:
        ctx = context_of(request)
        req = await read_json(request, ChatCompletionRequest, self._max_body)
        pipeline = self._pipeline
        model = pipeline.model(req.model)
        neutral = chat_request(req)
        rid = common.new_id("chatcmpl")
        prepared = await pipeline.prepare(neutral, model, ctx, request_id=rid)
        run = pipeline.run(prepared, ctx)
        view = _ChatView(rid, model.name, self._token_texts[model.name], req)
        if req.stream:
            return await view.stream(request, run)
        return await view.complete(run)


class _ChatView:
    """Renders one request's events as OpenAI chat JSON or SSE."""

    def __init__(self, rid: str, model: str, token_text: common.TokenText, req: ChatCompletionRequest) -> None:
        self._rid = rid
        self._model = model
        self._token_text = token_text
        self._n = req.n
        self._want_logprobs = req.logprobs
        self._top_n = req.top_logprobs or 0
        self._include_usage = common.include_usage(req)

    def _logprobs(self, lps: tuple[Any, ...]) -> list[dict[str, Any]]:
        return [self._token_text.chat_entry(lp, self._top_n) for lp in lps]

    async def complete(self, run: Run) -> web.Response:
        n = self._n
        texts: list[list[str]] = [[] for _ in range(n)]
        reasoning: list[list[str]] = [[] for _ in range(n)]
        calls: list[dict[int, dict[str, Any]]] = [{} for _ in range(n)]
        logprobs: list[list[dict[str, Any]]] = [[] for _ in range(n)]
        reasons: list[str | None] = [None] * n
        usage = run.usage
        async with contextlib.aclosing(run.events()) as events:
            async for batch in events:
                for ev in batch:
                    if type(ev) is ContentDelta:
                        texts[ev.index].append(ev.text)
                        if self._want_logprobs:
                            logprobs[ev.index].extend(self._logprobs(ev.logprobs))
                    elif type(ev) is Finish:
                        reasons[ev.index] = ev.reason
                    elif type(ev) is ReasoningDelta:
                        reasoning[ev.index].append(ev.text)
                    elif type(ev) is ToolCallDelta:
                        _merge_call(calls[ev.index], ev)
                    elif type(ev) is Usage:
                        usage = ev

        def message(i: int) -> dict[str, Any]:
            text = "".join(texts[i])
            # As OpenAI: a message that only calls tools has null content.
            msg: dict[str, Any] = {"role": "assistant", "content": text or None if calls[i] else text, "refusal": None}
            if reasoning[i]:
                msg["reasoning_content"] = "".join(reasoning[i])
            if calls[i]:
                msg["tool_calls"] = [calls[i][k] for k in sorted(calls[i])]
            return msg

        body = {
            "id": self._rid,
            "object": "chat.completion",
            "created": common.now_s(),
            "model": self._model,
            "choices": [
                {
                    "index": i,
                    "message": message(i),
                    "logprobs": {"content": logprobs[i], "refusal": None} if self._want_logprobs else None,
                    "finish_reason": _finish_reason(reasons[i], bool(calls[i])),
                }
                for i in range(n)
            ],
            "usage": common.usage_dict(usage),
            "system_fingerprint": None,
        }
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")

    async def stream(self, request: web.Request, run: Run) -> web.StreamResponse:
        frames = ChunkFrames(
            response_id=self._rid,
            obj="chat.completion.chunk",
            created=common.now_s(),
            model=self._model,
            include_usage=self._include_usage,
        )
        sink = _ChatSink(self, frames, run.usage)
        async with contextlib.aclosing(run.events(sink=sink)) as events:
            # The first batch is awaited before the 200 goes out, so "no healthy worker" or a worker that
            # cannot be reached is a plain HTTP error, not a broken stream.
            first = await anext(events, None)
            resp = await open_stream(request)
            out = sink.out = SseStream(resp)
            for i in range(self._n):
                out.add(
                    frames.with_choice(
                        {
                            "index": i,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": None,
                            "finish_reason": None,
                        }
                    )
                )
            try:
                batch = first
                while batch is not None:
                    sink.render(batch)
                    if sink.open_choices:
                        await out.flush()
                    # else every choice has ended: the run ends without waiting for the worker, and
                    # these frames go out with the usage chunk and [DONE] in the closing write.
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
        if self._include_usage:
            out.add(frames.usage(common.usage_dict(sink.usage)))
        await out.close()
        return resp

    def _frame(self, frames: ChunkFrames, index: int, delta: dict[str, Any], ev: ContentDelta | None) -> bytes:
        logprobs = (
            {"content": self._logprobs(ev.logprobs), "refusal": None}
            if ev is not None and self._want_logprobs
            else None
        )
        return frames.with_choice({"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": None})


class _ChatSink(SseSink):
    __slots__ = ("_frames", "_view", "called")

    def __init__(self, view: _ChatView, frames: ChunkFrames, usage: Usage) -> None:
        super().__init__(view._n, usage)
        self._view = view
        self._frames = frames
        self.called: set[int] = set()  # choices that made a tool call

    def render(self, batch: list[Event]) -> None:
        out = self.out
        assert out is not None
        frames, view = self._frames, self._view
        want_logprobs = view._want_logprobs
        for ev in batch:
            if type(ev) is ContentDelta:
                if want_logprobs:
                    out.add(view._frame(frames, ev.index, {"content": ev.text}, ev))
                else:
                    out.add(frames.chat_content(ev.index, ev.text))
            elif type(ev) is Finish:
                # OpenAI ends each choice with an empty delta and the reason.
                out.add(
                    frames.with_choice(
                        {
                            "index": ev.index,
                            "delta": {},
                            "logprobs": None,
                            "finish_reason": _finish_reason(ev.reason, ev.index in self.called),
                        }
                    )
                )
                self.open_choices -= 1
            elif type(ev) is Usage:
                self.usage = ev
            elif isinstance(ev, ReasoningDelta | ToolCallDelta):
                if type(ev) is ToolCallDelta:
                    self.called.add(ev.index)
                out.add(view._frame(frames, ev.index, _side_delta(ev), None))


def _finish_reason(reason: str | None, called: bool) -> str | None:
    """OpenAI's finish_reason: "tool_calls" when a choice that called a tool ended on its own."""
    return "tool_calls" if called and reason == "stop" else reason


def _side_delta(ev: ReasoningDelta | ToolCallDelta) -> dict[str, Any]:
    """The chunk delta of a reasoning or tool-call event (vLLM's field names)."""
    if isinstance(ev, ReasoningDelta):
        return {"reasoning_content": ev.text}
    call: dict[str, Any] = {"index": ev.call, "function": {"arguments": ev.arguments}}
    if ev.id is not None:
        call["id"] = ev.id
        call["type"] = "function"
    if ev.name is not None:
        call["function"]["name"] = ev.name
    return {"tool_calls": [call]}


def _merge_call(calls: dict[int, dict[str, Any]], ev: ToolCallDelta) -> None:
    call = calls.setdefault(ev.call, {"id": "", "type": "function", "function": {"name": "", "arguments": ""}})
    if ev.id is not None:
        call["id"] = ev.id
    if ev.name is not None:
        call["function"]["name"] = ev.name
    call["function"]["arguments"] += ev.arguments
