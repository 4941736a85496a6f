"""The Output stage as a pure core, no event loop: worker messages in, typed events out."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from node.pipeline.events import ContentDelta, Event, Finish, ReasoningDelta, ToolCallDelta
from node.pipeline.output import OutputProcessor, TextStage
from node.pipeline.parser_stage import ParserStage
from node.pipeline.parsers.registry import build_parser
from node.pipeline.spec import GenerateSpec
from node.pipeline.tokenizer import Tokenizer
from node.workers.types import SamplingParams, WorkerOutput

EOS = 128009
TEXT = " The quick brown fox jumps over the lazy dog; émigrés café 東京 🙂 and then it runs away."


def _spec(max_tokens: int, **kw: object) -> GenerateSpec:
    return GenerateSpec(
        request_id="r",
        prompt_ids=[1, 2, 3],
        params=SamplingParams(max_tokens=max_tokens),
        terminators=frozenset({EOS}),
        **kw,  # type: ignore[arg-type]
    )


def _message(ids: Sequence[int], finish: str | None = None) -> WorkerOutput:
    return WorkerOutput(
        index=0, token_ids=list(ids), prompt_tokens=3, completion_tokens=0, cached_tokens=0, finish_reason=finish
    )


def _chunks(ids: list[int], sizes: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    start = 0
    for size in itertools.cycle(sizes):
        if start >= len(ids):
            return out
        out.append(ids[start : start + size])
        start += size
    raise AssertionError("unreachable")


def _feed(output: OutputProcessor, chunks: list[list[int]]) -> list[Event]:
    """As vLLM streams: the chunks, then a final message repeating the last chunk's ids."""
    events: list[Event] = []
    for chunk in chunks:
        events.extend(output.feed([_message(chunk)]))
    events.extend(output.feed([_message(chunks[-1], finish="length")]))
    return events


def _text(events: Sequence[Event]) -> str:
    return "".join(e.text for e in events if isinstance(e, ContentDelta))


@settings(max_examples=60, deadline=None)
@given(sizes=st.lists(st.integers(1, 7), min_size=1, max_size=12), stops=st.sampled_from([(), (" lazy",), ("東京",)]))
def test_chunk_boundaries_change_nothing(llama3_tokenizer: Tokenizer, sizes: list[int], stops: tuple[str, ...]) -> None:
    ids = llama3_tokenizer.encode(TEXT, add_special_tokens=False)
    output = OutputProcessor(_spec(len(ids), stops=stops), llama3_tokenizer)
    events = _feed(output, _chunks(ids, sizes))
    expected = TEXT.split(stops[0], maxsplit=1)[0] if stops else TEXT
    assert _text(events) == expected
    # The finish names the stop string that ended the answer (Anthropic's stop_sequence).
    assert [e for e in events if isinstance(e, Finish)] == [
        Finish(0, "stop", stops[0]) if stops else Finish(0, "length")
    ]
    assert isinstance(events[-1], Finish), "a choice's Finish is its last event"
    upto = (
        len(llama3_tokenizer.encode(TEXT.split(stops[0], maxsplit=1)[0] + stops[0], add_special_tokens=False))
        if stops
        else len(ids)
    )
    assert output.usage.completion_tokens == upto, "usage counts the tokens the answer consumed, not the chunking"
    assert output.complete


def test_eos_mid_chunk_ends_the_choice_and_counts_itself(llama3_tokenizer: Tokenizer) -> None:
    ids = llama3_tokenizer.encode(" one two", add_special_tokens=False)
    output = OutputProcessor(_spec(50), llama3_tokenizer)
    events = output.feed([_message([*ids, EOS, 99, 100])])
    assert _text(events) == " one two" and events[-1] == Finish(0, "stop")
    assert output.usage.completion_tokens == len(ids) + 1
    assert output.complete and not output.worker_done, "the worker has not finished: Dispatch must abort it"


class _ThinkFirst:
    """A toy reasoning stage: text up to "|" is reasoning, the rest content (held back across chunks)."""

    def __init__(self) -> None:
        self._thinking = True
        self._held = ""

    def feed(self, index: int, text: str, events: list[Event]) -> str:
        if not self._thinking:
            return text
        self._held += text
        head, bar, rest = self._held.partition("|")
        if not bar:
            return ""
        self._thinking = False
        events.append(ReasoningDelta(index, head))
        return rest

    def finish(self, index: int, events: list[Event]) -> str:
        if self._thinking and self._held:
            events.append(ReasoningDelta(index, self._held))
        return ""


def test_text_stages_plug_in_between_stops_and_events(llama3_tokenizer: Tokenizer) -> None:
    ids = llama3_tokenizer.encode(" weigh options| the answer", add_special_tokens=False)

    def stages(spec: GenerateSpec) -> list[TextStage]:
        return [_ThinkFirst()]

    output = OutputProcessor(_spec(len(ids)), llama3_tokenizer, stages=stages)
    events = _feed(output, _chunks(ids, [1]))
    assert [e.text for e in events if isinstance(e, ReasoningDelta)] == [" weigh options"]
    assert _text(events) == " the answer"
    assert events[-1] == Finish(0, "length")


def test_choices_are_numbered_from_the_offset(llama3_tokenizer: Tokenizer) -> None:
    ids = llama3_tokenizer.encode(" hi", add_special_tokens=False)
    output = OutputProcessor(_spec(len(ids)), llama3_tokenizer, index_offset=4)
    events = output.feed([_message(ids, finish="length")])
    assert {e.index for e in events if isinstance(e, ContentDelta | Finish)} == {4}


def test_an_output_parser_plugs_in_as_a_text_stage(llama3_tokenizer: Tokenizer) -> None:
    text = (
        ' <think>check the weather</think>Sure. <tool_call>{"name": "get", "arguments": {"city": "Oslo"}}</tool_call>'
    )
    ids = llama3_tokenizer.encode(text, add_special_tokens=False)

    def stages(spec: GenerateSpec) -> list[TextStage]:
        return [ParserStage(build_parser(tool_parser="hermes", reasoning_parser="qwen3"))]

    for sizes in ([1], [3, 1, 7], [len(ids)]):
        output = OutputProcessor(_spec(len(ids)), llama3_tokenizer, stages=stages)
        events = _feed(output, _chunks(ids, sizes))
        assert "".join(e.text for e in events if isinstance(e, ReasoningDelta)) == "check the weather"
        calls = [e for e in events if isinstance(e, ToolCallDelta)]
        assert calls[0].name == "get" and "".join(c.arguments for c in calls) == '{"city": "Oslo"}'
        assert _text(events).strip() == "Sure.", "content keeps its place between reasoning and the call"
        kinds = [type(e).__name__ for e in events if not (isinstance(e, ContentDelta) and not e.text.strip())]
        assert kinds.index("ReasoningDelta") < kinds.index("ContentDelta") < kinds.index("ToolCallDelta")
        assert events[-1] == Finish(0, "length")


def _indexed(index: int, ids: Sequence[int], finish: str | None = None) -> WorkerOutput:
    return _message(ids, finish)._replace(index=index)


@settings(max_examples=80, deadline=None)
@given(
    sizes=st.lists(st.integers(1, 5), min_size=1, max_size=8),
    groups=st.lists(st.integers(1, 9), min_size=1, max_size=8),
    n=st.integers(1, 2),
    min_tokens=st.integers(0, 12),
    eos_at=st.integers(0, 60),
    parser=st.booleans(),
)
def test_messages_that_arrive_together_make_the_answer_they_make_one_by_one(
    llama3_tokenizer: Tokenizer,
    sizes: list[int],
    groups: list[int],
    n: int,
    min_tokens: int,
    eos_at: int,
    parser: bool,
) -> None:
    """The worker's messages arrive in batches (one read); a batch's chunks of a choice are stepped together.
    Text, reasoning and tool-call deltas joined, finish reasons and usage are those of feeding the messages
    one at a time, and a choice gets at most one content delta per run of its chunks in a batch."""
    text = f"<think>Let me see.</think>{TEXT}" + '<tool_call>{"name": "f", "arguments": {"a": 1}}</tool_call>'
    ids = llama3_tokenizer.encode(text if parser else TEXT, add_special_tokens=False)
    ids = [*ids[:eos_at], EOS, *ids[eos_at:]]  # an EOS somewhere: before min_tokens it does not end the answer
    spec = GenerateSpec(
        request_id="r",
        prompt_ids=[1, 2, 3],
        params=SamplingParams(max_tokens=len(ids), n=n, min_tokens=min_tokens),
        terminators=frozenset({EOS}),
    )
    # The messages of n choices interleaved, as a worker streams them, each choice ending as vLLM's does.
    messages: list[WorkerOutput] = []
    per_choice = [_chunks(ids, sizes[k:] + sizes[:k]) for k in range(n)]
    for step in range(max(len(c) for c in per_choice)):
        for k, chunks in enumerate(per_choice):
            if step < len(chunks):
                messages.append(_indexed(k, chunks[step]))
    for k, chunks in enumerate(per_choice):
        messages.append(_indexed(k, chunks[-1], finish="length"))

    def stages() -> OutputProcessor:
        # A tool-call parser as a text stage: it must see the same text whatever the batching.
        plug = (
            (lambda s: [ParserStage(build_parser(tool_parser="hermes", reasoning_parser="qwen3"))]) if parser else None
        )
        return OutputProcessor(spec, llama3_tokenizer, stages=plug)

    one_by_one, together = stages(), stages()
    alone: list[Event] = []
    for message in messages:
        alone.extend(one_by_one.feed([message]))
    batched: list[Event] = []
    start = 0
    for size in itertools.cycle(groups):
        if start >= len(messages) or together.complete:
            break
        batch = messages[start : start + size]
        start += size
        got = together.feed(batch)
        # A run of one choice's chunks (or a final message) makes one content delta at most, and one more
        # where the choice ends (what the text stages held back).
        runs = sum(
            1
            for a, b in itertools.pairwise([None, *batch])
            if a is None or a.index != b.index or a.finish_reason or b.finish_reason
        )
        runs += sum(1 for e in got if type(e) is Finish)
        assert sum(1 for e in got if type(e) is ContentDelta) <= runs
        batched.extend(got)
    for k in range(n):
        assert _joined(alone, k) == _joined(batched, k)
    assert together.usage == one_by_one.usage


def _joined(events: Sequence[Event], index: int) -> tuple[str, str, dict[int, tuple[str, str, str]], list[Event]]:
    """Choice ``index``'s content, reasoning and tool calls (id, name, arguments by call) joined, and finishes."""
    content = "".join(e.text for e in events if type(e) is ContentDelta and e.index == index)
    reasoning = "".join(e.text for e in events if type(e) is ReasoningDelta and e.index == index)
    calls: dict[int, tuple[str, str, str]] = {}
    for e in events:
        if type(e) is ToolCallDelta and e.index == index:
            cid, name, args = calls.get(e.call, ("", "", ""))
            calls[e.call] = (cid + (e.id or ""), name + (e.name or ""), args + e.arguments)
    return content, reasoning, calls, [e for e in events if type(e) is Finish and e.index == index]
