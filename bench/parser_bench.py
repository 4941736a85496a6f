"""CPU time per output token of the streaming output parsers (node/pipeline/parsers).

Each parser is fed an output one token-sized piece at a time, as the Output stage does after
detokenizing, and the CPU time of ``feed`` plus ``finish`` is divided by the number of pieces. Outputs:

- ``plain``: English prose, no markup (the hot path: target <= 2 us per token);
- ``angle``: code and HTML full of ``<`` (characters that may start a marker, so pieces are inspected);
- ``markup``: the family's own reasoning and/or tool-call markup around some prose.

    .venv/bin/python bench/parser_bench.py [--tokens 20000] [--rounds 5]

Pieces come from a regex close to BPE pre-tokenization (a word with its leading space, a punctuation run,
whitespace), ~4 characters each, like real tokens. Figures are the best round's CPU microseconds per piece.
"""

from __future__ import annotations

import argparse
import re
import time
from collections.abc import Callable

from node.pipeline.parsers.calls import ToolOptions
from node.pipeline.parsers.events import StreamParser
from node.pipeline.parsers.registry import build_parser

PROSE = (
    "The gateway detokenizes worker output and splits it into reasoning, content and tool calls before "
    "it reaches the client, so the cost of that split sits on every streamed token. Most replies carry no "
    "markup at all; the parser should then cost next to nothing. "
)
ANGLE = '<div class="row">if (a < b && c > d) { return x<<2; }</div> <span>List<String> xs;</span>\n'
CALL_JSON = '{"city": "Paris", "unit": "celsius", "days": 3}'
MARKUP: dict[str, str] = {
    "hermes": f'<tool_call>\n{{"name": "get_weather", "arguments": {CALL_JSON}}}\n</tool_call>',
    "qwen3_coder": "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n</function>\n"
    "</tool_call>",
    "glm45": "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>",
    "deepseek_v3": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_weather\n```json\n"
    f"{CALL_JSON}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "deepseek_v31": "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>"
    f"{CALL_JSON}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "kimi_k2": "<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>"
    f"{CALL_JSON}<|tool_call_end|><|tool_calls_section_end|>",
    "mistral": f"[TOOL_CALLS]get_weather[ARGS]{CALL_JSON}",
    "llama3_json": f'{{"name": "get_weather", "parameters": {CALL_JSON}}}',
    "llama4_pythonic": '[get_weather(city="Paris", unit="celsius", days=3)]',
    "openai": "<|channel|>analysis<|message|>{prose}<|end|><|start|>assistant<|channel|>commentary "
    f"to=functions.get_weather <|constrain|>json<|message|>{CALL_JSON}<|call|>",
}
# (label, tool parser, reasoning parser)
CONFIGS: list[tuple[str, str | None, str | None]] = [
    ("none (plain passthrough)", None, None),
    ("qwen3 reasoning", None, "qwen3"),
    *[(name, name, None) for name in MARKUP],
    ("qwen3 + hermes", "hermes", "qwen3"),
]
_PIECE = re.compile(r" ?\w+| ?[^\w\s]+|\s+")


def pieces(text: str, count: int) -> list[str]:
    out: list[str] = []
    while len(out) < count:
        out += _PIECE.findall(text)
    return out[:count]


def cpu_per_piece(make: Callable[[], StreamParser], chunks: list[str], rounds: int) -> float:
    best = float("inf")
    for _ in range(rounds):
        parser = make()
        feed = parser.feed
        start = time.process_time()
        for chunk in chunks:
            feed(chunk)
        parser.finish()
        best = min(best, time.process_time() - start)
    return best / len(chunks) * 1e6


def markup_output(tool: str | None, reasoning: str | None, tokens: int) -> list[str]:
    """A reply in the config's own markup: (reasoning,) prose, then a call; repeated to ``tokens`` pieces
    for formats that allow several calls, else one reply padded with prose in front."""
    prose_part = PROSE * 3
    text = ""
    if reasoning == "qwen3" or tool is None:
        text += f"<think>\n{prose_part}\n</think>\n\n"
    if tool == "openai":
        return pieces(MARKUP["openai"].replace("{prose}", prose_part * (tokens // 150 + 1)), tokens)
    if tool in ("llama3_json", "llama4_pythonic"):  # the whole reply is the call: one long call
        call = MARKUP[tool].replace('"Paris"', '"' + "Paris " * (tokens // 2) + '"')
        return pieces(call, tokens)
    if tool == "mistral":  # calls end the reply: prose, then one call with long arguments
        call = MARKUP[tool].replace('"Paris"', '"' + "Paris " * (tokens // 4) + '"')
        return [*pieces(PROSE, tokens // 2), *pieces(call, tokens - tokens // 2)]
    body = text + (prose_part + MARKUP[tool]) * (tokens // 150 + 1) if tool else text * (tokens // 100 + 1)
    return pieces(body, tokens)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=20000)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    plain = pieces(PROSE, args.tokens)
    angle = pieces(ANGLE, args.tokens)
    print(f"{'parser':28} {'plain us/tok':>13} {'angle us/tok':>13} {'markup us/tok':>14}")
    for label, tool, reasoning in CONFIGS:

        def make(tool: str | None = tool, reasoning: str | None = reasoning) -> StreamParser:
            return build_parser(tool_parser=tool, reasoning_parser=reasoning, options=ToolOptions())

        marked = markup_output(tool, reasoning, args.tokens)
        row = [cpu_per_piece(make, chunks, args.rounds) for chunks in (plain, angle, marked)]
        print(f"{label:28} {row[0]:13.2f} {row[1]:13.2f} {row[2]:14.2f}")


if __name__ == "__main__":
    main()
