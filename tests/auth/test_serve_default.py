"""`smg-node serve`'s safe default: an open node only on loopback, unless `--auth none` says otherwise."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.procs import REPO, SMG_NODE


def test_serve_on_a_public_address_without_auth_refuses_to_start(llama3_model_dir: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SMG_NODE_")}
    args = [*SMG_NODE, "serve", "--host", "0.0.0.0", "--port", "0", "--model-path", str(llama3_model_dir)]
    done = subprocess.run(args, cwd=REPO, env=env, capture_output=True, timeout=60, check=False)
    assert done.returncode == 2 and b"--auth none" in done.stderr, done.stderr
    bad = [*args, "--auth-bootstrap-key-file", "/nonexistent/key"]
    done = subprocess.run(bad, cwd=REPO, env=env, capture_output=True, timeout=60, check=False)
    assert done.returncode != 0 and b"/nonexistent/key" in done.stderr, done.stderr
