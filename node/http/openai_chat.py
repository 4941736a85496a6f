"""POST /v1/chat/completions: render the chat template, tokenize, generate, answer as OpenAI does."""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
from aiohttp import web

from node.errors import GatewayError, InvalidRequest
from node.http import openai_common as common
from node.http.errors import error_object, read_json
from node.http.openai_types import ChatCompletionRequest, ChatMessage
from node.http.sse import ChunkFrames, SseStream, frame, open_stream
from node.pipeline.generate import GenerateSpec, Generation, TextDelta
from node.pipeline.template import TemplateError


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


class ChatCompletions(common.GenerationApi):
    def _render(self, req: ChatCompletionRequest, messages: list[dict[str, Any]]) -> str:
        """The prompt text: the chat template over ``messages``."""
        template = self._model.template
        if template is None:
            raise InvalidRequest(
                "This model has no chat template; use /v1/completions or start the node with --chat-template."
            )
        tools = [msgspec.to_builtins(t) for t in req.tools] if req.tools else None
        try:
            text = template.render(
                messages,
                tools=tools,
                add_generation_prompt=req.add_generation_prompt,
                extra=req.chat_template_kwargs,
            )
        except TemplateError as exc:
            raise InvalidRequest(f"The chat template could not render these messages: {exc}", param="messages") from exc
        if req.continue_final_message:
            # Hugging Face semantics: the prompt ends right after the final message's content.
            final = messages[-1]["content"] or ""
            cut = text.rfind(final) if final else -1
            if cut < 0:
                raise InvalidRequest("Could not find the final message in the rendered prompt.", param="messages")
            text = text[: cut + len(final)]
        return text

    async def handle(self, request: web.Request) -> web.StreamResponse:
        req = await read_json(request, ChatCompletionRequest, self._max_body)
        return await self._peer_for(req.model)._serve(request, req)

    async def _serve(self, request: web.Request, req: ChatCompletionRequest) -> web.StreamResponse:
        model = self._model
        common.check_model(req.model, model)
        common.validate_sampling(req, model)
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
        stops = common.stop_strings(req)
        messages = template_messages(req.messages)
        size = sum(len(m["content"] or "") for m in messages)
        prompt_ids = await self._cpu.render_and_encode(size, lambda: self._render(req, messages), model.tokenizer)
        requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        param = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
        cap = self._limits.output_cap(req.n, logprobs=req.logprobs)
        max_tokens = common.resolve_max_tokens(
            requested, len(prompt_ids), model, param=param, prompt_param="messages", cap=cap
        )
        top_n = req.top_logprobs or 0
        params = common.sampling_params(req, model, max_tokens=max_tokens, logprobs=top_n if req.logprobs else None)
        rid = common.new_id("chatcmpl")
        spec = GenerateSpec(
            model=self._model.name,
            request_id=rid,
            prompt_ids=prompt_ids,
            params=params,
            stops=stops,
            include_stop_str=req.include_stop_str_in_output,
            terminators=common.terminators(req, model),
            routing_key=request.headers.get(self._routing_key_header),
            client_stream=req.stream,
        )
        gen = Generation(spec, pool=self._pool, tokenizer=model.tokenizer)
        if req.stream:
            include_usage = req.stream_options is not None and req.stream_options.include_usage
            return await self._stream(request, req, gen, rid, include_usage=include_usage, top_n=top_n)
        return await self._complete(req, gen, rid, top_n=top_n)

    async def _complete(self, req: ChatCompletionRequest, gen: Generation, rid: str, *, top_n: int) -> web.Response:
        texts = [[] for _ in range(req.n)]  # type: list[list[str]]
        logprobs: list[list[dict[str, Any]]] = [[] for _ in range(req.n)]
        reasons: list[str | None] = [None] * req.n
        async with contextlib.aclosing(gen.deltas()) as deltas:
            async for batch in deltas:
                for d in batch:
                    texts[d.index].append(d.text)
                    if d.finish_reason is not None:
                        reasons[d.index] = d.finish_reason
                    if req.logprobs:
                        logprobs[d.index].extend(self._token_text.chat_entry(lp, top_n) for lp in d.logprobs)
        self._on_usage(gen.usage)
        body = {
            "id": rid,
            "object": "chat.completion",
            "created": common.now_s(),
            "model": self._model.name,
            "choices": [
                {
                    "index": i,
                    "message": {"role": "assistant", "content": "".join(texts[i]), "refusal": None},
                    "logprobs": {"content": logprobs[i], "refusal": None} if req.logprobs else None,
                    "finish_reason": reasons[i],
                }
                for i in range(req.n)
            ],
            "usage": common.usage_dict(gen.usage),
            "system_fingerprint": None,
        }
        return web.Response(body=msgspec.json.encode(body), content_type="application/json")

    async def _stream(
        self,
        request: web.Request,
        req: ChatCompletionRequest,
        gen: Generation,
        rid: str,
        *,
        include_usage: bool,
        top_n: int,
    ) -> web.StreamResponse:
        frames = ChunkFrames(
            response_id=rid,
            obj="chat.completion.chunk",
            created=common.now_s(),
            model=self._model.name,
            include_usage=include_usage,
        )
        async with contextlib.aclosing(gen.deltas()) as deltas:
            # The first batch is awaited before the 200 goes out, so "no healthy worker" or a worker that
            # cannot be reached is a plain HTTP error, not a broken stream.
            first = await anext(deltas, None)
            resp = await open_stream(request)
            out = SseStream(resp)
            for i in range(req.n):
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
            open_choices = req.n
            try:
                batch = first
                while batch is not None:
                    for d in batch:
                        out.add(self._frame(frames, d, req.logprobs, top_n))
                        if d.finish_reason is not None:
                            open_choices -= 1
                    if open_choices:
                        await out.flush()
                    # else every choice has ended: the generator ends without waiting for the worker, and
                    # these frames go out with the usage chunk and [DONE] in the closing write.
                    batch = await anext(deltas, None)
            except GatewayError as exc:
                out.add(frame({"error": error_object(exc)}))
                await out.close()
                return resp
        self._on_usage(gen.usage)
        if include_usage:
            out.add(frames.usage(common.usage_dict(gen.usage)))
        await out.close()
        return resp

    def _frame(self, frames: ChunkFrames, d: TextDelta, want_logprobs: bool, top_n: int) -> bytes:
        if d.finish_reason is None and not want_logprobs:
            return frames.chat_content(d.index, d.text)
        delta: dict[str, Any] = {"content": d.text} if d.text or d.finish_reason is None else {}
        logprobs = (
            {"content": [self._token_text.chat_entry(lp, top_n) for lp in d.logprobs], "refusal": None}
            if want_logprobs
            else None
        )
        frame_bytes = frames.with_choice(
            {"index": d.index, "delta": delta, "logprobs": logprobs, "finish_reason": None}
        )
        if d.finish_reason is None:
            return frame_bytes
        # The finishing delta may carry text; OpenAI ends each choice with an empty delta and the reason.
        tail = frames.with_choice({"index": d.index, "delta": {}, "logprobs": None, "finish_reason": d.finish_reason})
        return (frame_bytes if d.text or d.logprobs else b"") + tail
