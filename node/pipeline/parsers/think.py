"""Reasoning between ``<think>`` and ``</think>`` (Qwen3, DeepSeek-R1, GLM-4.5, Kimi K2 Thinking).

One reasoning block per output, as the published formats have it: text before ``<think>`` is content, text
up to ``</think>`` is reasoning, everything after is content (a later ``<think>`` is ordinary text). Chat
templates that open the block in the prompt (DeepSeek-R1, Qwen3 thinking models) make the output start
inside it: construct with ``in_reasoning=True`` (see `prompt_opens_reasoning`). An output that ends inside
the block (max_tokens hit while thinking) ends as reasoning. The markers themselves are never emitted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from node.pipeline.parsers.events import ContentDelta, Event, ReasoningDelta
from node.pipeline.parsers.markers import marker_set

THINK_START: Final = "<think>"
THINK_END: Final = "</think>"

_BEFORE, _INSIDE, _AFTER = 0, 1, 2


def prompt_opens_reasoning(prompt: str, start: str = THINK_START, end: str = THINK_END) -> bool:
    """True when the rendered prompt leaves a reasoning block open, so the output starts inside it."""
    return prompt.rfind(start) > prompt.rfind(end)


class ThinkParser:
    """Splits output into reasoning and content at the think markers."""

    __slots__ = ("_buf", "_end", "_start", "_state")

    def __init__(self, *, in_reasoning: bool = False, start: str = THINK_START, end: str = THINK_END) -> None:
        self._start = marker_set(start)
        self._end = marker_set(end)
        self._state = _INSIDE if in_reasoning else _BEFORE
        self._buf = ""

    def feed(self, text: str, token_ids: Sequence[int] = ()) -> list[Event]:
        if self._state == _AFTER:
            return [ContentDelta(text)] if text else []
        markers = self._start if self._state == _BEFORE else self._end
        if not self._buf and not markers.may_hold(text):  # the hot path: no markup in sight
            if not text:
                return []
            return [ContentDelta(text) if self._state == _BEFORE else ReasoningDelta(text)]
        self._buf += text
        return self._scan(final=False)

    def finish(self) -> list[Event]:
        return self._scan(final=True)

    def _scan(self, *, final: bool) -> list[Event]:
        out: list[Event] = []
        while self._buf:
            if self._state == _AFTER:
                out.append(ContentDelta(self._buf))
                self._buf = ""
                break
            inside = self._state == _INSIDE
            markers = self._end if inside else self._start
            found = markers.find(self._buf)
            if found is not None:
                at, marker = found
                if at:
                    out.append(ReasoningDelta(self._buf[:at]) if inside else ContentDelta(self._buf[:at]))
                self._buf = self._buf[at + len(marker) :]
                self._state = _AFTER if inside else _INSIDE
                continue
            keep = 0 if final else markers.held_len(self._buf)
            ready = self._buf[: len(self._buf) - keep]
            if ready:
                out.append(ReasoningDelta(ready) if inside else ContentDelta(ready))
            self._buf = self._buf[len(ready) :]
            break
        return out
