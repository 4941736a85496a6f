"""The model folders a benchmark runs on, by name.

- ``llama3``: `smg-node models prepare --family llama3`, Meta's layout: the tokenizer.json post-processor
  ends with a `TemplateProcessing` step prepending ``<|begin_of_text|>`` (SMG's native tokenizer declines
  it and falls back to Hugging Face).
- ``llama3-nobos``: the same folder with that step removed and ``add_bos_token`` false in
  tokenizer_config.json (the packaged tokenizer as shipped). SMG rebuilds a BOS `TemplateProcessing` step
  from ``add_bos_token: true``, as transformers does, so the flag must go too for SMG to tokenize the
  folder natively. Chat prompts are unchanged: the template writes ``<|begin_of_text|>`` itself.
- ``qwen``: ``--family qwen``, Qwen3's vocabulary with its NFC normalizer and no post-processor ids.
- ``deepseek``: ``--family deepseek``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path
from typing import Final, Literal, get_args

from bench.launch import SMG_NODE, LaunchError, child_env

Folder = Literal["llama3", "llama3-nobos", "qwen", "deepseek"]
FOLDERS: Final[tuple[Folder, ...]] = get_args(Folder)
_NOBOS_SUFFIX: Final = "-nobos"
PREPARE_TIMEOUT_S: Final = 180.0


def prepare(name: Folder, out_dir: Path) -> Path:
    """The folder ``name`` under ``out_dir`` (built or reused); its path.

    Raises:
        LaunchError: `smg-node models prepare` failed, or the Llama-3 folder has no BOS step to remove.
    """
    family = name.removesuffix(_NOBOS_SUFFIX)
    cmd = [*SMG_NODE, "models", "prepare", "--family", family, "--out", str(out_dir)]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=PREPARE_TIMEOUT_S, check=False, env=child_env())
    if done.returncode != 0:
        raise LaunchError(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()}")
    folder = Path(done.stdout.strip().splitlines()[-1])
    if not name.endswith(_NOBOS_SUFFIX):
        return folder
    return without_bos_step(folder, out_dir / name)


def without_bos_step(source: Path, target: Path) -> Path:
    """A copy of ``source`` whose tokenizer.json post-processor has no `TemplateProcessing` step and whose
    tokenizer_config.json does not ask for a BOS (``add_bos_token`` false).

    Raises:
        LaunchError: the source has no such step.
    """
    definition = json.loads((source / "tokenizer.json").read_text("utf-8"))
    post = definition.get("post_processor")
    steps = post.get("processors", []) if isinstance(post, dict) and post.get("type") == "Sequence" else [post]
    kept = [s for s in steps if isinstance(s, dict) and s.get("type") != "TemplateProcessing"]
    if len(kept) == len([s for s in steps if s is not None]):
        raise LaunchError(f"{source}/tokenizer.json has no TemplateProcessing step to remove")
    if len(kept) > 1:
        definition["post_processor"] = {"type": "Sequence", "processors": kept}
    else:
        definition["post_processor"] = kept[0] if kept else None
    config = json.loads((source / "tokenizer_config.json").read_text("utf-8"))
    config["add_bos_token"] = False
    shutil.copytree(source, target, dirs_exist_ok=True)
    (target / "tokenizer.json").write_text(json.dumps(definition, ensure_ascii=False), "utf-8")
    (target / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=1), "utf-8")
    return target
