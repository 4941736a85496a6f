"""CPU per encode of distinct real-text prompts, in process: the native encoder, tiktoken and Hugging Face.

Each corpus (`bench.corpora`) is cut into ``--texts`` distinct texts of ``--chars`` characters (about 7,800
tokens at the default); every engine encodes each text once, as plain text (no added tokens), and the
median over ``--rounds`` rounds of the mean CPU time per text is reported, with the ratio to the native
encoder. The native encoder's cache of merged words persists across texts and rounds, as in a serving node.
Engines: ``native`` (`node/pipeline/_bytebpe.c`), ``tiktoken`` (the same vocabulary and the composed split
regex, this thread's own encoding) and ``huggingface`` (``encode_batch_fast`` of one text; ``--hf`` only: slow).

    .venv/bin/python -m bench.encoder_bench [--folders qwen,llama3-nobos] [--corpora prose,code,latin,cjk,json]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

from bench import corpora, folders
from node.pipeline.tokenizer import Tokenizer


def texts_of(corpus: corpora.Corpus, count: int, chars: int) -> list[str]:
    """``count`` distinct texts of ``chars`` characters (fewer if the corpus is short)."""
    units = corpora.units(corpus)
    out: list[str] = []
    current: list[str] = []
    size = 0
    for unit in units:
        current.append(unit)
        size += len(unit) + 2
        if size >= chars:
            out.append("\n\n".join(current)[:chars])
            current, size = [], 0
            if len(out) == count:
                break
    return out


def cpu_per_text(encode: Callable[[str], object], texts: Sequence[str], rounds: int) -> float:
    """Median over ``rounds`` of the mean CPU seconds per text (this thread)."""
    samples = []
    for _ in range(rounds):
        started = time.thread_time()
        for text in texts:
            encode(text)
        samples.append((time.thread_time() - started) / len(texts))
    return statistics.median(samples)


def engines(tok: Tokenizer, hf: bool) -> dict[str, Callable[[str], object]]:
    fast = tok._fast
    if fast is None:
        raise SystemExit(f"no fast encoder: {tok.encode_path.encoder_reason}")
    found: dict[str, Callable[[str], object]] = {}
    native = fast._native
    if native is not None:
        found["native"] = lambda text: native.encode(text, True)
    encoding = fast._thread_encoding()
    found["tiktoken"] = lambda text: encoding._core_bpe.encode_to_tiktoken_buffer(text, set())
    if hf:
        raw = tok.raw
        found["huggingface"] = lambda text: raw.encode_batch_fast([text], add_special_tokens=False)
    return found


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--folders", default="qwen,llama3-nobos")
    parser.add_argument("--corpora", default="prose,code,latin,cjk,json")
    parser.add_argument("--texts", type=int, default=40)
    parser.add_argument("--chars", type=int, default=31_000, help="characters per text (~7,800 tokens of prose)")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--hf", action="store_true", help="also Hugging Face (slow)")
    args = parser.parse_args(argv)
    print("| folder | corpus | texts | tokens/text | engine | CPU ms/text | × native |")
    print("|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for name in args.folders.split(","):
            folder = folders.prepare(name, Path(scratch))  # type: ignore[arg-type]
            tok = Tokenizer.from_file(folder, cache=None)
            found = engines(tok, args.hf)
            for corpus in args.corpora.split(","):
                try:
                    texts = texts_of(corpus, args.texts, args.chars)  # type: ignore[arg-type]
                except corpora.CorpusError as exc:
                    print(f"| {name} | {corpus} | — | — | — | {exc} | |")
                    continue
                tokens = sum(len(tok.encode_uncached(t, add_special_tokens=False)) for t in texts) // len(texts)
                costs = {engine: cpu_per_text(fn, texts, args.rounds) for engine, fn in found.items()}
                base = costs.get("native")
                for engine, cost in costs.items():
                    ratio = f"{cost / base:.2f}" if base else "—"
                    print(f"| {name} | {corpus} | {len(texts)} | {tokens:,} | {engine} | {cost * 1e3:.3f} | {ratio} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
