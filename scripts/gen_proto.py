"""Generate mesh/wire_pb/ from proto/*.proto with protoc (grpcio-tools, pinned in the dev extra), or check it.

    .venv/bin/python scripts/gen_proto.py           # regenerate after editing a .proto
    .venv/bin/python scripts/gen_proto.py --check   # exit 1 if the checked-in code is stale (tests run this)

The output depends on the protoc version, so grpcio-tools is pinned exactly: bump it and regenerate together.
"""

from __future__ import annotations

import argparse
import filecmp
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTO_DIR = ROOT / "proto"
OUT_DIR = ROOT / "mesh" / "wire_pb"
#: Hand-written files of the generated package (not protoc's output).
KEEP = frozenset({"__init__.py"})


def generate(out: Path) -> list[str]:
    """Run protoc over every proto/*.proto into ``out``; return the generated file names."""
    protos = sorted(p.name for p in PROTO_DIR.glob("*.proto"))
    cmd = [sys.executable, "-m", "grpc_tools.protoc", f"-I{PROTO_DIR}", f"--python_out={out}", f"--pyi_out={out}"]
    subprocess.run([*cmd, *protos], check=True, cwd=PROTO_DIR)
    return sorted(p.name for p in out.iterdir() if p.is_file() and p.name not in KEEP)


def check() -> list[str]:
    """Names of files that differ between a fresh generation and mesh/wire_pb/ (missing or extra included)."""
    with tempfile.TemporaryDirectory() as tmp:
        fresh = generate(Path(tmp))
        current = sorted(p.name for p in OUT_DIR.iterdir() if p.is_file() and p.name not in KEEP)
        stale = sorted(set(fresh) ^ set(current))
        stale += [n for n in fresh if n in current and not filecmp.cmp(Path(tmp) / n, OUT_DIR / n, shallow=False)]
        return stale


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="compare instead of writing")
    if parser.parse_args().check:
        stale = check()
        if stale:
            print(f"mesh/wire_pb is stale ({', '.join(stale)}): run scripts/gen_proto.py", file=sys.stderr)
            return 1
        return 0
    OUT_DIR.mkdir(exist_ok=True)
    for name in generate(OUT_DIR):
        print(f"wrote mesh/wire_pb/{name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
