"""Issue 13's whole matrix in one command, for a quiet machine: every model folder × every corpus with our
load generator (`bench.gateway_bench`), then each folder once more under NVIDIA's aiperf
(`bench.aiperf_bench`).

    .venv/bin/python -m bench.matrix                                   # everything (several hours)
    .venv/bin/python -m bench.matrix --folders llama3-nobos,qwen --corpora prose,cjk --reps 3
    .venv/bin/python -m bench.matrix --skip-aiperf --gateway-args "--prompts 7800 --outputs 20"

Each run writes its table, raw JSON and logs under ``--out-dir/<folder>-<corpus>/`` (aiperf: ``aiperf/``),
and the tables are gathered into ``--out-dir/matrix.md``. A failed run is reported and the matrix goes on.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from bench import aiperf_bench, gateway_bench
from bench.corpora import CORPORA
from bench.folders import FOLDERS

DEFAULT_OUT_DIR = Path(__file__).resolve().parent / "out" / "matrix"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.matrix", description=__doc__)
    parser.add_argument("--folders", default=",".join(FOLDERS))
    parser.add_argument("--corpora", default=",".join(CORPORA))
    parser.add_argument("--reps", type=int, default=3, help="repetitions per run (medians are reported)")
    parser.add_argument("--gateway-args", default="", help="extra bench.gateway_bench flags, one string")
    parser.add_argument("--aiperf-args", default="", help="extra bench.aiperf_bench flags, one string")
    parser.add_argument("--aiperf-corpus", default="prose", help="corpus of the aiperf runs")
    parser.add_argument("--skip-aiperf", action="store_true")
    parser.add_argument("--out-dir", type=Path, default=DEFAULT_OUT_DIR)
    args = parser.parse_args(argv)
    out: Path = args.out_dir
    out.mkdir(parents=True, exist_ok=True)
    summary = [f"# Matrix run {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}", ""]
    failed: list[str] = []
    for folder in args.folders.split(","):
        for corpus in args.corpora.split(","):
            run_dir = out / f"{folder}-{corpus}"
            flags = ["--folder", folder, "--corpus", corpus, "--reps", str(args.reps), "--out-dir", str(run_dir)]
            print(f"[{time.strftime('%H:%M:%S')}] gateway_bench {folder} × {corpus}", file=sys.stderr, flush=True)
            if gateway_bench.main([*flags, *shlex.split(args.gateway_args)]) != 0:
                failed.append(f"gateway_bench {folder} {corpus}")
            tables = sorted(run_dir.glob("gateway_bench-*.md"))
            text = tables[-1].read_text("utf-8") if tables else "(no table)"
            summary += [f"## {folder} × {corpus} (bench.load)", "", text, ""]
        if not args.skip_aiperf:
            run_dir = out / "aiperf" / folder
            flags = ["--folder", folder, "--corpus", args.aiperf_corpus, "--reps", str(args.reps)]
            flags += ["--out-dir", str(run_dir)]
            try:
                aiperf_bench.main([*flags, *shlex.split(args.aiperf_args)])
            except Exception as exc:
                failed.append(f"aiperf {folder}: {exc}")
            tables = sorted(run_dir.rglob("aiperf_bench.md"))
            text = tables[-1].read_text("utf-8") if tables else "(no table)"
            summary += [f"## {folder} × {args.aiperf_corpus} (aiperf)", "", text, ""]
    if failed:
        summary += ["## Failed", "", *[f"- {f}" for f in failed]]
    (out / "matrix.md").write_text("\n".join(summary) + "\n", "utf-8")
    print(f"wrote {out / 'matrix.md'}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
