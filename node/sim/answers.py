"""What the simulated engine answers beyond prose: constrained output, tool calls and reasoning, as the model
family would write them.

The engine sees only token ids, so it reads the prompt the way the model would: decoded with the folder's own
tokenizer, in the family's markup (found by ``node.pipeline.parsers.detect`` from the chat template and the
special tokens, the same detection the gateway runs):

- **Tools offered**: the family's tools block (Hermes/Qwen ``<tools>`` lines, Llama-3's indented JSON after
  ``Environment: ipython``, DeepSeek's ``### name`` / ``Parameters:``) lists the functions and their argument
  schemas. Under ``auto`` the answer is then, per seed, one call (most often), several calls in parallel, or
  plain text; arguments are random instances of each function's schema. Once the last turn is a tool result
  the answer is plain text, so an agent loop ends. Calls are written in the family's exact token format:
  Llama-3 JSON objects joined by ``; ``, Hermes ``<tool_call>`` blocks, DeepSeek V3 / V3.1 special tokens.
- **Thinking**: a family whose template thinks answers with a reasoning run closed by ``</think>``: opened by
  the model (``<think>`` first) unless the prompt already opened it; none when the prompt closed it
  (Qwen3's ``enable_thinking=false``, or the gateway closing a block at a reasoning budget: the answer follows).
- **A constraint** (json_schema, json_object, regex, choice, a grammar of the small subset
  ``node.sim.grammar_sample`` reads) is the whole answer, with neither reasoning nor markup, as vLLM's guided
  decoding writes it without a reasoning parser; structural tags and other grammars get prose.

Reading a prompt costs one decode, done only when the cheap gate of the family (its tools special token in
the ids, or Llama-3's tools header at the start) says tools are there, and only for prompts up to
``MAX_SCAN_TOKENS``: a 7.3k-token prompt with tools costs 3-4 ms per answer (decode, tools, arguments,
encode), one without tools 0.01-0.06 ms (Llama-3 and Qwen folders, 2-core machine).
"""

from __future__ import annotations

import json
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from tokenizers import Tokenizer

from node.sim.grammar_sample import GrammarUnsupported, sample_grammar
from node.sim.json_instance import sample_schema
from node.sim.regex_sample import sample_regex
from node.sim.token_generator import Prose, Script, Segment, answer_length
from node.structured.constraint import Constraint, ToolSpec, tool_specs

# Odds, under tool_choice auto with tools offered, that the answer calls tools, and that a call is joined
# by more (up to MAX_PARALLEL_CALLS): mostly calls, sometimes several, sometimes text, like an agent model.
TOOL_CALL_PROBABILITY = 0.75
PARALLEL_CALL_PROBABILITY = 0.3
MAX_PARALLEL_CALLS = 3
# Prompts longer than this are not read for tools (the decode would cost more than the rest of a request).
MAX_SCAN_TOKENS = 32_768
# Tokens at the start decoded to find Llama-3's tools header, and at the end to see a <think> the prompt opened.
HEAD_TOKENS = 24
TAIL_TOKENS = 8
# Words decoded from the vocabulary for string values in generated JSON.
SAMPLE_WORDS = 256
_SALT = 0xA6E7_71C5

Thinking = Literal["model", "open", "off"]


@dataclass(frozen=True, slots=True)
class _Markup:
    """How one family's template writes tools, turns and tool results (node/models/templates)."""

    tools_start: str
    tools_end: str
    user_turn: str
    tool_result: str
    gate_token: str | None  # a special token the template writes only when tools are offered


_MARKUP = {
    "hermes": _Markup("<tools>\n", "</tools>", "<|im_start|>user", "<tool_response>", "<tool_call>"),
    "llama3_json": _Markup(
        "Environment: ipython",
        "<|eot_id|>",
        "<|start_header_id|>user<|end_header_id|>",
        "<|start_header_id|>ipython<|end_header_id|>",
        None,
    ),
    "deepseek_v3": _Markup(
        "## Tools", "To call functions", "<｜User｜>", "<｜tool▁output▁begin｜>", "<｜tool▁calls▁begin｜>"
    ),
}
_MARKUP["deepseek_v31"] = _MARKUP["deepseek_v3"]
_DEEPSEEK_TOOL = re.compile(r"\n### ([^\n]+)\n(?:Description: [^\n]*\n)?\nParameters: ")


@dataclass(frozen=True, slots=True)
class PromptFacts:
    tools: tuple[ToolSpec, ...] = ()
    after_tool_result: bool = False
    thinking: Thinking | None = None  # None: the family does not think


def tools_in_text(text: str, parser: str) -> tuple[ToolSpec, ...]:
    """The functions a decoded prompt offers in the family's tools block (empty: none, or unknown family)."""
    markup = _MARKUP.get(parser)
    if markup is None:
        return ()
    start = text.find(markup.tools_start)
    if start < 0:
        return ()
    end = text.find(markup.tools_end, start + len(markup.tools_start))
    region = text[start : end if end >= 0 else len(text)]
    decoder = json.JSONDecoder()
    found: list[dict[str, object]] = []
    if parser.startswith("deepseek"):
        for match in _DEEPSEEK_TOOL.finditer(region):
            try:
                params, _ = decoder.raw_decode(region, match.end())
            except ValueError:
                continue
            found.append({"name": match.group(1), "parameters": params})
        return tuple(tool_specs(found))
    pos = region.find("{")
    while pos >= 0:
        try:
            value, after = decoder.raw_decode(region, pos)
        except ValueError:
            pos = region.find("{", pos + 1)
            continue
        if isinstance(value, dict) and (isinstance(value.get("function"), dict) or "name" in value):
            found.append(value)
        pos = region.find("{", after)
    return tuple(tool_specs(found))


def _json(value: object) -> str:
    return json.dumps(value, ensure_ascii=False)


def render_calls(parser: str, calls: Sequence[tuple[str, object]]) -> str:
    """Calls as the family writes them (the formats node/pipeline/parsers reads)."""
    if parser == "llama3_json":
        return "; ".join(json.dumps({"name": n, "parameters": a}, ensure_ascii=False) for n, a in calls)
    if parser == "hermes":
        blocks = (
            "<tool_call>\n" + json.dumps({"name": n, "arguments": a}, ensure_ascii=False) + "\n</tool_call>"
            for n, a in calls
        )
        return "\n".join(blocks)
    if parser == "deepseek_v3":
        blocks = (
            f"<｜tool▁call▁begin｜>function<｜tool▁sep｜>{n}\n```json\n{_json(a)}\n```<｜tool▁call▁end｜>"
            for n, a in calls
        )
        return "<｜tool▁calls▁begin｜>" + "\n".join(blocks) + "<｜tool▁calls▁end｜>"
    if parser == "deepseek_v31":
        blocks = (
            f"<｜tool▁call▁begin｜>{n}<｜tool▁sep｜>{json.dumps(a, ensure_ascii=False)}<｜tool▁call▁end｜>"
            for n, a in calls
        )
        return "<｜tool▁calls▁begin｜>" + "".join(blocks) + "<｜tool▁calls▁end｜>"
    raise ValueError(f"no call format for the tool parser {parser!r}")


def constrained_text(constraint: Constraint, rng: random.Random, words: Sequence[str] = ()) -> str | None:
    """A string the constraint accepts; None for a kind the simulator does not write (structural tags, a
    grammar outside its subset). Raises ValueError for a constraint no engine could apply."""
    kind = constraint.kind
    if kind == "choice":
        return rng.choice(constraint.choices)
    if kind == "regex":
        return sample_regex(constraint.text, rng)
    if kind in ("json_schema", "json_object"):
        if kind == "json_schema":
            schema = json.loads(constraint.text)
        else:  # any object: one string member keeps it from being the trivial {}
            key = rng.choice(words) if words else "answer"
            schema = {"type": "object", "properties": {key: {"type": "string"}}, "required": [key]}
        return json.dumps(sample_schema(schema, rng, words), ensure_ascii=False)
    if kind == "grammar":
        try:
            return sample_grammar(constraint.text, rng)
        except GrammarUnsupported:
            return None
    return None


class FamilyAnswers:
    """Scripts answers for one model folder; built once per engine."""

    def __init__(self, tokenizer: Tokenizer, *, tool_parser: str | None, thinks: bool) -> None:
        """``tool_parser`` (vLLM's name) and ``thinks`` (a reasoning parser applies): the family, as the
        gateway's detection (``node.pipeline.parsers.detect``) finds it in the folder."""
        self._tokenizer = tokenizer
        self._parser = tool_parser if tool_parser in _MARKUP else None
        self._markup = _MARKUP.get(self._parser or "")
        gate = self._markup.gate_token if self._markup is not None else None
        self._gate_id = tokenizer.token_to_id(gate) if gate else None
        self._thinks = thinks
        self._words: tuple[str, ...] = ()

    @property
    def tool_parser(self) -> str | None:
        """The family's call format, when the simulator writes it."""
        return self._parser

    def words(self, word_ids: Sequence[int]) -> tuple[str, ...]:
        if not self._words and word_ids:
            decoded = self._tokenizer.decode_batch([[i] for i in word_ids[:SAMPLE_WORDS]])
            self._words = tuple(w.strip() for w in decoded if w.strip())
        return self._words

    def facts(self, prompt_ids: Sequence[int]) -> PromptFacts:
        thinking: Thinking | None = None
        if self._thinks:
            tail = self._decode(prompt_ids[-TAIL_TOKENS:]).rstrip()
            thinking = "open" if tail.endswith("<think>") else "off" if tail.endswith("</think>") else "model"
        markup = self._markup
        if markup is None or self._parser is None or len(prompt_ids) > MAX_SCAN_TOKENS:
            return PromptFacts(thinking=thinking)
        if self._gate_id is not None:
            if self._gate_id not in prompt_ids:
                return PromptFacts(thinking=thinking)
        elif markup.tools_start not in self._decode(prompt_ids[:HEAD_TOKENS]):
            return PromptFacts(thinking=thinking)
        text = self._decode(prompt_ids)
        tools = tools_in_text(text, self._parser)
        after_result = text.rfind(markup.tool_result) > text.rfind(markup.user_turn)
        return PromptFacts(tools, after_result and markup.tool_result in text, thinking)

    def script(
        self,
        prompt_ids: Sequence[int],
        constraint: Constraint | None,
        seed: int,
        *,
        mean_length: int,
        word_ids: Sequence[int] = (),
    ) -> Script | None:
        """The answer's segments; None when it is plain prose (the stream's own default).

        Raises:
            ValueError: the constraint cannot be applied (an invalid schema or regex).
        """
        rng = random.Random(seed ^ _SALT)
        if constraint is not None:
            text = constrained_text(constraint, rng, self.words(word_ids))
            return None if text is None else (self._encode(text),)
        facts = self.facts(prompt_ids)
        segments: list[Segment] = []
        if facts.thinking in ("model", "open"):
            opening = "<think>\n" if facts.thinking == "model" else ""
            if opening:
                segments.append(self._encode(opening))
            segments.append(Prose(answer_length(mean_length, rng)))
            segments.append(self._encode("\n</think>\n\n"))
        if self._parser is not None and facts.tools and not facts.after_tool_result:
            calls = self._calls(facts.tools, rng, word_ids)
            if calls:
                return (*segments, self._encode(render_calls(self._parser, calls)))
        if not segments:
            return None
        segments.append(Prose())
        return tuple(segments)

    def _calls(
        self, tools: Sequence[ToolSpec], rng: random.Random, word_ids: Sequence[int]
    ) -> list[tuple[str, object]]:
        """Under auto: usually one call, sometimes several in parallel, sometimes none (plain text)."""
        if rng.random() >= TOOL_CALL_PROBABILITY:
            return []
        count = 1
        while count < MAX_PARALLEL_CALLS and rng.random() < PARALLEL_CALL_PROBABILITY:
            count += 1
        words = self.words(word_ids)
        calls: list[tuple[str, object]] = []
        for _ in range(count):
            tool = rng.choice(tools)
            calls.append((tool.name, sample_schema(tool.parameters, rng, words)))
        return calls

    def _decode(self, ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=False)

    def _encode(self, text: str) -> tuple[int, ...]:
        return tuple(self._tokenizer.encode(text, add_special_tokens=False).ids)
