"""deploy/compose/ read without Docker: Compose accepts it (every profile), the node's flags are `serve`'s, and
the `vllm` profile builds the engine as the real-engine tier runs it (tests/real_engine/launcher.py). The
docker tier (tests/deploy/) brings the default profile up for real; the vLLM image is too heavy to build there."""

from __future__ import annotations

import ast
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
import yaml

from node.cli import build_parser, load_node_config
from tests.real_engine.launcher import MODEL_CONFIG, VLLM_REQUIREMENTS

DIR = Path(__file__).resolve().parent.parent / "deploy" / "compose"
COMPOSE = shutil.which("docker-compose")


def _fill(arg: str, env: dict[str, str] | None = None) -> str:
    """``${VAR:-default}`` as Compose fills it, from ``env`` or else the default."""
    return re.sub(r"\$\{(\w+):-([^}]*)\}", lambda m: (env or {}).get(m.group(1), m.group(2)), arg)


def _services() -> dict[str, Any]:
    return dict(yaml.safe_load((DIR / "docker-compose.yml").read_text(encoding="utf-8"))["services"])


@pytest.mark.skipif(COMPOSE is None, reason="docker-compose is not installed (apt-get install docker-compose)")
@pytest.mark.parametrize("profiles", [[], ["vllm"], ["postgres", "vllm"]])
def test_compose_accepts_the_file(profiles: list[str]) -> None:
    assert COMPOSE is not None
    args = [COMPOSE, *(a for p in profiles for a in ("--profile", p)), "config", "--services"]
    done = subprocess.run(args, cwd=DIR, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert {"node", "lb", "worker-1", "worker-2", "redis", *profiles} <= set(done.stdout.split())


def test_node_command_is_serve_flags() -> None:
    # ${VAR:-default} as Compose fills it when VAR is unset.
    command = [_fill(arg) for arg in _services()["node"]["command"]]
    assert build_parser().parse_args(command).command == "serve"  # exits on an unknown flag


@pytest.mark.parametrize("history", [None, "redis", "postgres"])
def test_nodes_keep_api_keys_in_their_shared_durable_history_backend(
    history: str | None, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Keys made with /admin/keys must work on every node and survive every node restarting: the nodes' key
    store is their history backend (node/app.py `_key_store`), so it is Redis (the default) or Postgres, the
    same server for every node, its data on a named volume (Redis with its append-only file)."""
    dockerfile = (DIR.parent / "docker" / "Dockerfile").read_text(encoding="utf-8")
    model = re.search(r"SMG_NODE_MODEL_PATH=(\S+)", dockerfile)
    assert model is not None
    monkeypatch.setenv("SMG_NODE_MODEL_PATH", model.group(1))  # the image's, as the container sees it
    services = _services()
    env = {"SMG_HISTORY": history} if history else {}
    config = load_node_config(build_parser().parse_args([_fill(a, env) for a in services["node"]["command"]]))
    assert config.storage.backend == (history or "redis")
    assert not config.auth.keys_file  # one shared store, not a file per container
    if config.storage.backend == "redis":
        assert urlparse(config.storage.redis_url).hostname == "redis"
        assert "redis-data:/data" in services["redis"]["volumes"] and "redis" in services["node"]["depends_on"]
        cmd = (DIR / "redis" / "Dockerfile").read_text(encoding="utf-8").rsplit("\nCMD ", 1)[1]
        assert '"--appendonly", "yes"' in cmd and '"--dir", "/data"' in cmd
    else:
        assert urlparse(config.storage.postgres_url).hostname == "postgres"
        assert "postgres-data:/var/lib/postgresql/data" in services["postgres"]["volumes"]


def test_vllm_profile_builds_the_engine_the_real_engine_tier_runs() -> None:
    dockerfile = (DIR / "vllm" / "Dockerfile").read_text(encoding="utf-8")
    joined = dockerfile.replace("\\\n", " ")
    install = next(line for line in joined.splitlines() if line.startswith("RUN pip install"))
    for requirement in VLLM_REQUIREMENTS:
        assert requirement in install.split()
    # The tiny model's config is the tier's (Llama-3's vocabulary and special ids, a head size the CPU backend has).
    call = re.search(r"LlamaConfig\((.*?)\);", joined)
    assert call is not None
    parsed = ast.parse(f"f({call.group(1)})").body[0]
    assert isinstance(parsed, ast.Expr) and isinstance(parsed.value, ast.Call)
    kwargs = {k.arg: ast.literal_eval(k.value) for k in parsed.value.keywords}
    assert kwargs.pop("torch_dtype") == "bfloat16"
    assert kwargs == MODEL_CONFIG
    # save_pretrained writes its own generation_config.json: the tokenizer files must be copied after it.
    assert joined.index("save_pretrained") < joined.index("/opt/models/llama3/generation_config.json")
    launch = re.search(r"grpc_server (.*?)\"\]", joined)
    assert launch is not None
    flags = launch.group(1).split()
    assert "--enforce-eager" in flags and "--enable-prefix-caching" in flags
    # Served under the simulated workers' model name: the nodes serve one model, llama3, from all three.
    assert flags[flags.index("--served-model-name") + 1] == "llama3"
    assert "/opt/models/llama3" in _services()["worker-1"]["command"]
    assert "HF_HUB_OFFLINE=1" in joined and "VLLM_CPU_KVCACHE_SPACE" in joined


def test_vllm_registration_sends_the_bootstrap_key_when_keys_are_required() -> None:
    register = _services()["vllm-register"]
    assert "SMG_NODE_AUTH_BOOTSTRAP_KEY" in register["environment"]
    script = register["command"][0]
    assert 'headers["Authorization"] = "Bearer "' in script
    compile(script, "vllm-register", "exec")
