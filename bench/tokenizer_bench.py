"""CPU time per encode of the gateway's tokenizer paths, for a short and a long chat prompt.

Paths: Hugging Face ``Tokenizer.encode``, Hugging Face ``encode_batch_fast`` (one text, and 8 texts per call:
what coalescing concurrent requests into one batch would buy; figures are per text), the tiktoken fast
path (`Tokenizer.encode_uncached`), an L0 hit (a completion prompt without special tokens, again), the
same chat prompt again (served by L1 from its last cut: chat prompts are not copied into L0), and an L1
hit on the next turn of a conversation whose previous turn is cached (its last user message differs per
call).
Each row runs ``--repeat`` encodes spread over 1 and 2 threads and prints wall and CPU (all threads,
Rust pools included) milliseconds per encode.

    .venv/bin/python bench/tokenizer_bench.py [--models llama3,deepseek] [--repeat 1.0] [--rounds 3]

The long conversation has a ~2,000-token system prompt; the short one a ~20-token system prompt.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from node.models.prepare import prepare_model
from node.pipeline.model import load_model_folder
from node.pipeline.probe_corpus import probe_texts
from node.pipeline.template import ChatTemplate
from node.pipeline.tokenizer import Tokenizer

PROSE = (
    "The gateway tokenizes every request before it reaches a worker, so its CPU cost sits on the "
    "critical path of time-to-first-token. Long system prompts, retrieved documents and tool schemas "
    "make prompts of several thousand tokens common; multi-turn chats resend the whole history. "
)
CODE = "def handler(request):\n    payload = json.loads(request.body)\n    return {'ok': True, 'n': len(payload)}\n"


@dataclass(frozen=True)
class Conversation:
    """Prompts of one conversation: ``previous`` (cached first) and ``nexts`` (one per L1-hit call)."""

    previous: str
    nexts: list[str]


def _filler(tokens: int, tok: Tokenizer) -> str:
    parts = [*probe_texts(()), PROSE, CODE]
    text, i = "", 0
    while len(tok.encode_uncached(text, add_special_tokens=False)) < tokens:
        text += parts[i % len(parts)] + "\n"
        i += 1
    return text


def conversation(tok: Tokenizer, template: ChatTemplate, system_tokens: int, total_tokens: int, n: int) -> Conversation:
    """Turns are added until the next turn's prompt reaches ``total_tokens``."""
    history: list[dict[str, Any]] = [{"role": "system", "content": _filler(system_tokens, tok)}]
    turn = 0
    while True:
        history.append({"role": "user", "content": f"Question {turn}: {PROSE}"})
        previous = template.render(history, add_generation_prompt=True)
        history.append({"role": "assistant", "content": f"Answer {turn}: {CODE}{PROSE}"})
        turn += 1

        def follow_up(i: int) -> str:
            message = {"role": "user", "content": f"Follow-up {i}: {PROSE}"}
            return template.render([*history, message], add_generation_prompt=True)

        if len(tok.encode_uncached(follow_up(0), add_special_tokens=False)) >= total_tokens:
            return Conversation(previous, [follow_up(i) for i in range(n)])


COALESCED = 8  # texts per call in the coalescing row


def measure(fn: Callable[[str], object], texts: Sequence[str], threads: int, warm: str) -> tuple[float, float]:
    """(wall ms, CPU ms) per call of ``fn`` over ``texts``, spread over ``threads`` threads, after each
    thread ran ``fn(warm)`` once."""
    chunks = [texts[i::threads] for i in range(threads)]

    def run(chunk: Sequence[str]) -> None:
        for text in chunk:
            fn(text)

    with ThreadPoolExecutor(threads) as pool:
        list(pool.map(run, [[warm]] * threads))  # start the threads, warm lazy regex state
        wall0, cpu0 = time.perf_counter(), time.process_time()
        list(pool.map(run, chunks))
        wall, cpu = time.perf_counter() - wall0, time.process_time() - cpu0
    return wall * 1000 / len(texts), cpu * 1000 / len(texts)


def bench_model(family: str, models_dir: Path, repeat: float, rounds: int) -> list[tuple[str, ...]]:
    folder = prepare_model(family, models_dir)  # type: ignore[arg-type]
    meta = load_model_folder(folder)
    assert meta.chat_template is not None
    template = ChatTemplate(meta.chat_template, bos_token=meta.bos_token, eos_token=meta.eos_token)
    tok = Tokenizer.from_file(folder)
    raw = tok.raw
    rows: list[tuple[str, ...]] = []
    for label, system_tokens, total_tokens, calls in (("~200", 20, 200, 400), ("~7,800", 2000, 7800, 30)):
        n = max(2, int(calls * repeat))
        conv = conversation(tok, template, system_tokens, total_tokens, n)
        prompt = conv.nexts[0]
        size = len(tok.encode_uncached(prompt, add_special_tokens=False))
        completion = _filler(size, tok)  # no added tokens: L0 serves its repeats
        same = [prompt] * n
        paths: list[tuple[str, Callable[[str], object], list[str]]] = [
            ("HF encode", lambda s: raw.encode(s, add_special_tokens=False), same),
            ("HF encode_batch_fast", lambda s: raw.encode_batch_fast([s], add_special_tokens=False), same),
            (
                f"HF encode_batch_fast, {COALESCED} per call",
                lambda s: raw.encode_batch_fast([s] * COALESCED, add_special_tokens=False),
                same[: max(2, n // COALESCED)],
            ),
            (
                f"fast path ({tok.encode_path.encoder})",
                lambda s: tok.encode_uncached(s, add_special_tokens=False),
                same,
            ),
            ("cached: L0 hit (completion text)", lambda s: tok.encode(s, add_special_tokens=True), [completion] * n),
            ("cached: same chat prompt (L1)", lambda s: tok.encode(s, add_special_tokens=False), same),
            ("cached: L1 hit (next turn)", lambda s: tok.encode(s, add_special_tokens=False), conv.nexts),
        ]
        for name, fn, texts in paths:
            cells = []
            for threads in (1, 2):
                best_wall = best_cpu = float("inf")
                for _ in range(rounds):  # the minimum over rounds filters out other load on the machine
                    tok.clear_cache()
                    tok.encode(conv.previous, add_special_tokens=False)  # the previous turn is cached
                    tok.encode(prompt, add_special_tokens=False)  # L1 holds the repeated prompt
                    tok.encode(completion, add_special_tokens=True)  # L0 holds the completion text
                    wall, cpu = measure(fn, texts, threads, warm=conv.previous)
                    if name.endswith("per call"):
                        wall, cpu = wall / COALESCED, cpu / COALESCED
                    best_wall, best_cpu = min(best_wall, wall), min(best_cpu, cpu)
                cells += [f"{best_wall:.3f}", f"{best_cpu:.3f}"]
            rows.append((family, f"{label} ({size})", name, *cells))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="llama3,deepseek")
    parser.add_argument("--repeat", type=float, default=1.0, help="scale the number of calls per row")
    parser.add_argument("--rounds", type=int, default=3, help="report the fastest of this many rounds")
    args = parser.parse_args()
    header = ("model", "prompt tokens", "path", "1T wall ms", "1T CPU ms", "2T wall ms", "2T CPU ms")
    rows: list[tuple[str, ...]] = [header]
    with tempfile.TemporaryDirectory() as tmp:
        for family in args.models.split(","):
            rows += bench_model(family, Path(tmp), args.repeat, args.rounds)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    for i, row in enumerate(rows):
        print("  ".join(c.rjust(w) if j >= 3 else c.ljust(w) for j, (c, w) in enumerate(zip(row, widths, strict=True))))
        if i == 0:
            print("  ".join("-" * w for w in widths))


if __name__ == "__main__":
    main()
