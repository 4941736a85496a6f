"""`smg-node demo`, as the README's first command runs it: a fresh model cache (the demo prepares its folder),
a real process; it answers a chat completion, streamed and not, and stops cleanly on Ctrl-C. Its time to
first answer is measured by `python -m bench.cold_start` (bench/RESULTS.md, "Cold start"), not here."""

from __future__ import annotations

import json
import signal
import urllib.request
from pathlib import Path

from tests.procs import SMG_NODE, free_port, process, wait_until


def _chat(port: int, **extra: object) -> tuple[int, bytes]:
    body = {"model": "llama3", "messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 8, **extra}
    request = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=10) as resp:
            return int(resp.status), resp.read()
    except OSError:  # not listening yet, or 503 while its workers start
        return 0, b""


def test_demo_answers_from_a_fresh_cache(tmp_path: Path) -> None:
    port = free_port()
    log = tmp_path / "demo.log"
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    with process([*SMG_NODE, "demo", "--port", str(port)], log=log, env=env) as demo:
        wait_until(lambda: _chat(port)[0] == 200 or demo.poll() is not None, timeout_s=120, what="a first answer")
        assert demo.poll() is None, log.read_text()
        status, body = _chat(port)
        assert status == 200
        answer = json.loads(body)
        assert answer["model"] == "llama3" and answer["choices"][0]["message"]["content"]
        assert answer["usage"]["completion_tokens"] > 0
        status, streamed = _chat(port, stream=True)
        assert status == 200 and streamed.rstrip().endswith(b"data: [DONE]")
        assert (tmp_path / "cache" / "smg-node" / "models" / "llama3" / "tokenizer.json").is_file()
        text = log.read_text()
        assert f"smg-node is serving 'llama3' at http://127.0.0.1:{port}/v1" in text
        assert "Traceback" not in text
        demo.send_signal(signal.SIGINT)
        assert demo.wait(timeout=30) == 0, log.read_text()
