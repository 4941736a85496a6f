"""Typed output events: what the pipeline's Output stage emits and every API adapter renders into its own
JSON or SSE. Choices are numbered across the whole request (``prompt * n + choice`` for a batch).

Per choice the order is: content/reasoning/tool-call deltas, then exactly one ``Finish``. A run that ends
normally emits one ``Usage`` last (a run that fails emits none).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple, Protocol


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class ContentDelta(NamedTuple):
    """New answer text for choice ``index`` (may be empty when it carries only logprobs or token ids).

    A NamedTuple (immutable, built per token): a frozen dataclass pays ``object.__setattr__`` per field."""

    index: int  # type: ignore[assignment]  # the choice number; shadows tuple.index, which nothing here calls
    text: str
    logprobs: tuple[TokenLogprob, ...] = ()
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class ReasoningDelta:
    """New reasoning text for choice ``index`` (a reasoning parser's output, node/pipeline/parser_stage.py)."""

    index: int
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    """A tool call of choice ``index`` growing: its ``call`` number, then id and name once, arguments in
    pieces (a tool-call parser's output, node/pipeline/parser_stage.py)."""

    index: int
    call: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@dataclass(frozen=True, slots=True)
class Finish:
    """Choice ``index`` ended: "stop" (EOS, stop token or string) or "length" (the token budget, or a
    reasoning budget no answer fits after). ``stop``: the client's stop string that ended it (None: EOS, a
    stop token, a budget)."""

    index: int
    reason: str
    stop: str | None = None


@dataclass(slots=True)
class Usage:
    """Tokens the answer consumed (exact even when the gateway cut it short). Accumulated while the run
    goes; emitted once, last, when it ended normally."""

    prompt_tokens: int
    completion_tokens: int = 0
    cached_tokens: int = 0
    # Completion tokens spent inside a reasoning block (counted by token id; 0 without a reasoning parser).
    reasoning_tokens: int = 0

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


Event = ContentDelta | ReasoningDelta | ToolCallDelta | Finish | Usage


class EventSink(Protocol):
    """An adapter that can take a stream's events synchronously, as the worker's messages arrive (the push
    path, node/pipeline/dispatch.py): no task wake-up per token. ``take`` is called only right after
    ``ready`` said yes, in the same step, and must then send the events as the adapter's own loop would."""

    def ready(self) -> bool:
        """Events can be taken and sent now, without waiting (the stream is open and the client keeps up)."""
        ...

    def take(self, events: list[Event]) -> None: ...
