"""Reading a Hugging Face-style model folder: the facts GetModelInfo reports and the tokenizer.

Only the files a tokenizer-only folder carries are read (config.json, generation_config.json,
tokenizer_config.json, tokenizer.json); no weights. JSON is untyped, so every field is checked here and
nothing untyped leaves this module.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from node.sim.errors import ModelFolderError

# vLLM's fallback when config.json names no context length (`_get_and_verify_max_len`).
DEFAULT_MAX_CONTEXT_LENGTH = 2048
# config.json keys that carry the context length, in the order vLLM tries them.
_CONTEXT_LENGTH_KEYS = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
)
# generation_config.json keys vLLM reports as default sampling params (default_sampling_params_json).
SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


@dataclass(frozen=True, slots=True)
class ModelFolder:
    """What the engine needs to know about the model it pretends to run."""

    path: Path
    tokenizer_path: Path
    served_model_name: str
    model_type: str
    architectures: tuple[str, ...]
    max_context_length: int
    vocab_size: int
    eos_token_ids: tuple[int, ...]
    """The EOS ids GetModelInfo reports (config.json, else generation_config.json)."""
    stop_eos_token_ids: tuple[int, ...]
    """Every EOS id that ends generation (generation_config.json and config.json together)."""
    primary_eos_token_id: int | None
    """The EOS the engine emits; vLLM reports no matched token id when this one ends a sequence."""
    bos_token_id: int | None
    pad_token_id: int | None
    sampling_defaults: Mapping[str, float]


def load_model_folder(model_path: str, served_model_name: str = "") -> tuple[ModelFolder, Tokenizer]:
    """Read the folder at ``model_path``.

    Raises:
        ModelFolderError: the path is empty or not a folder, tokenizer.json is missing or unreadable, or a
            JSON file is malformed.
    """
    if not model_path:
        raise ModelFolderError("model_path is required (a folder holding tokenizer.json and config.json)")
    path = Path(model_path).expanduser().resolve()
    if not path.is_dir():
        raise ModelFolderError(f"model_path {model_path!r} is not a folder")
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.is_file():
        raise ModelFolderError(f"{tokenizer_file} is missing")
    # The small JSON files first: a typo there fails before the seconds-long tokenizer load.
    config = _read_json(path / "config.json")
    generation = _read_json(path / "generation_config.json")
    tokenizer_config = _read_json(path / "tokenizer_config.json")
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        raise ModelFolderError(f"cannot load {tokenizer_file}: {exc}") from exc

    config_eos = _id_list(config.get("eos_token_id"), "config.json eos_token_id")
    generation_eos = _id_list(generation.get("eos_token_id"), "generation_config.json eos_token_id")
    reported_eos = config_eos or generation_eos
    stop_eos = tuple(dict.fromkeys(generation_eos + config_eos))

    tokenizer_eos = _special_token_id(tokenizer, tokenizer_config.get("eos_token"))
    primary_eos = tokenizer_eos if tokenizer_eos is not None else (stop_eos[0] if stop_eos else None)
    if primary_eos is not None and primary_eos not in stop_eos:
        stop_eos = (primary_eos, *stop_eos)

    bos = _optional_int(config.get("bos_token_id"), "config.json bos_token_id")
    if bos is None:
        bos = _optional_int(generation.get("bos_token_id"), "generation_config.json bos_token_id")

    config_vocab = _optional_int(config.get("vocab_size"), "config.json vocab_size")
    vocab_size = max(config_vocab or 0, tokenizer.get_vocab_size(with_added_tokens=True))

    architectures = config.get("architectures", [])
    if not isinstance(architectures, list) or not all(isinstance(a, str) for a in architectures):
        raise ModelFolderError("config.json architectures must be a list of strings")
    model_type = config.get("model_type", "")
    if not isinstance(model_type, str):
        raise ModelFolderError("config.json model_type must be a string")

    sampling_defaults = {
        key: float(value)
        for key in SAMPLING_DEFAULT_KEYS
        if isinstance(value := generation.get(key), int | float) and not isinstance(value, bool)
    }
    folder = ModelFolder(
        path=path,
        tokenizer_path=path,
        served_model_name=served_model_name or path.name,
        model_type=model_type,
        architectures=tuple(architectures),
        max_context_length=_context_length(config),
        vocab_size=vocab_size,
        eos_token_ids=reported_eos,
        stop_eos_token_ids=stop_eos,
        primary_eos_token_id=primary_eos,
        bos_token_id=bos,
        pad_token_id=_optional_int(config.get("pad_token_id"), "config.json pad_token_id"),
        sampling_defaults=sampling_defaults,
    )
    return folder, tokenizer


def _read_json(file: Path) -> dict[str, object]:
    """A JSON object from ``file``, or an empty one when the file is absent."""
    if not file.is_file():
        return {}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise ModelFolderError(f"cannot read {file}: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFolderError(f"{file} must hold a JSON object")
    return data


def _optional_int(value: object, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise ModelFolderError(f"{what} must be an integer, got {value!r}")
    return value


def _id_list(value: object, what: str) -> tuple[int, ...]:
    """An id field that may be one int or a list of ints (Hugging Face allows both)."""
    if value is None:
        return ()
    if isinstance(value, list):
        return tuple(i for item in value if (i := _optional_int(item, what)) is not None)
    single = _optional_int(value, what)
    return () if single is None else (single,)


def _special_token_id(tokenizer: Tokenizer, token: object) -> int | None:
    """The id of a tokenizer_config special token, given as a string or as an AddedToken dict."""
    if isinstance(token, dict):
        token = token.get("content")
    if not isinstance(token, str) or not token:
        return None
    token_id = tokenizer.token_to_id(token)
    return token_id if isinstance(token_id, int) else None


def _context_length(config: Mapping[str, object]) -> int:
    for key in _CONTEXT_LENGTH_KEYS:
        value = _optional_int(config.get(key), f"config.json {key}")
        if value is not None and value > 0:
            return value
    return DEFAULT_MAX_CONTEXT_LENGTH
