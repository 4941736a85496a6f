"""CPU per output token of the Output stage with and without the output parsers (issue 15): what a
request pays in the gateway for reasoning and tool-call parsing, detokenizing and event building included.

    .venv/bin/python -m bench.output_parser_stage_bench [--tokens 800] [--rounds 7]

The Qwen model folder (its tokenizer, its detected parsers), one token per worker message as a streamed
answer arrives; median of the rounds, process CPU time.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from node.models.prepare import prepare_model
from node.pipeline.output import OutputProcessor
from node.pipeline.parser_stage import parser_stages
from node.pipeline.parsing import ParserPlan
from node.pipeline.served_model import ServedModel, load_served_model
from node.pipeline.spec import GenerateSpec
from node.workers.types import SamplingParams, WorkerOutput

PROSE = "The quick brown fox jumps over the lazy dog, and then it runs far away into the forest. "
THINK = "<think>\nLet me think about the fox for a while now.\n</think>\n\n"


def per_token_us(model: ServedModel, plan: ParserPlan | None, answer: list[int], rounds: int) -> float:
    spec = GenerateSpec(request_id="r", prompt_ids=[1, 2, 3], params=SamplingParams(max_tokens=1 << 30), parsing=plan)
    times = []
    for _ in range(rounds):
        out = OutputProcessor(spec, model.tokenizer, stages=parser_stages)
        msgs = [WorkerOutput(0, [t], 3, k + 1, 0, None) for k, t in enumerate(answer)]
        start = time.process_time()
        for msg in msgs:
            out.feed([msg])
        times.append((time.process_time() - start) / len(answer) * 1e6)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=800)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = load_served_model(str(prepare_model("qwen", Path(tmp))), served_name="qwen")
    tok = model.tokenizer
    text = tok.encode(PROSE * (args.tokens // 18 + 1), add_special_tokens=False)[: args.tokens]
    think = tok.encode(THINK, add_special_tokens=False)
    p = model.parsers
    reasoning = ParserPlan(None, p.reasoning_parser, None, False, None, p.keep_ids, p.think_ids)
    both = ParserPlan(p.tool_parser, p.reasoning_parser, {"get_weather": {}}, False, None, p.keep_ids, p.think_ids)
    rows = [
        ("no parser", None, text),
        (f"{p.reasoning_parser}", reasoning, text),
        (f"{p.reasoning_parser}+{p.tool_parser}", both, text),
        (f"{p.reasoning_parser}+{p.tool_parser}, think block first", both, think + text),
    ]
    print(f"{'Output stage':42} us/token")
    for name, plan, answer in rows:
        print(f"{name:42} {per_token_us(model, plan, answer, args.rounds):6.2f}")


if __name__ == "__main__":
    main()
