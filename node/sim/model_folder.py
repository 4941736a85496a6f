"""Reading a Hugging Face-style model folder: the facts GetModelInfo reports and the tokenizer.

Only the files a tokenizer-only folder carries are read (config.json, generation_config.json,
tokenizer_config.json, tokenizer.json); no weights, and only tokenizer.json is required. The files are read
and typed by the gateway's own readers (node/pipeline/model.py), so both sides read a folder alike; what
differs is what vLLM reports from them (GetModelInfo's EOS ids, sampling defaults, a 2,048 default context).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from tokenizers import Tokenizer

from node.models.parses import TokenizerParses
from node.pipeline import model as files
from node.sim.errors import ModelFolderError

# vLLM's fallback when config.json names no context length (`_get_and_verify_max_len`).
DEFAULT_MAX_CONTEXT_LENGTH = 2048
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


def load_model_folder(
    model_path: str, served_model_name: str = "", parses: TokenizerParses | None = None
) -> tuple[ModelFolder, Tokenizer]:
    """Read the folder at ``model_path`` (``parses``: tokenizer.json parses shared with other loaders in the
    process, e.g. the demo's node).

    Raises:
        ModelFolderError: the path is empty or not a folder, tokenizer.json is missing or unreadable, or a
            JSON file is malformed or has a field of the wrong type (the message names the file).
    """
    if not model_path:
        raise ModelFolderError("model_path is required (a folder holding tokenizer.json and config.json)")
    path = Path(model_path).expanduser().resolve()
    if not path.is_dir():
        raise ModelFolderError(f"model_path {model_path!r} is not a folder")
    tokenizer_file = path / files.TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise ModelFolderError(f"{tokenizer_file} is missing")
    try:
        return _load(path, tokenizer_file, served_model_name, parses)
    except files.ModelFolderError as exc:
        raise ModelFolderError(str(exc)) from exc


def _load(
    path: Path, tokenizer_file: Path, served_model_name: str, parses: TokenizerParses | None
) -> tuple[ModelFolder, Tokenizer]:
    # The small JSON files first: a typo there fails before the seconds-long tokenizer load.
    config_file = path / files.CONFIG_FILE
    generation_file = path / files.GENERATION_CONFIG_FILE
    tokenizer_config_file = path / files.TOKENIZER_CONFIG_FILE
    config = files.read_json(config_file, required=False)
    generation = files.read_json(generation_file, required=False)
    tokenizer_config = files.read_json(tokenizer_config_file, required=False)
    try:
        if parses is None:
            tokenizer = Tokenizer.from_file(str(tokenizer_file))
        else:
            tokenizer = parses.parse(tokenizer_file.read_bytes())
    except Exception as exc:  # tokenizers raises a bare Exception on a malformed file
        raise ModelFolderError(f"cannot load {tokenizer_file}: {exc}") from exc

    config_eos = tuple(files.id_list(config, "eos_token_id", config_file))
    generation_eos = tuple(files.id_list(generation, "eos_token_id", generation_file))
    reported_eos = config_eos or generation_eos
    stop_eos = tuple(dict.fromkeys(generation_eos + config_eos))

    eos_token = files.token_content(tokenizer_config, "eos_token", tokenizer_config_file)
    tokenizer_eos = tokenizer.token_to_id(eos_token) if eos_token else None
    primary_eos = tokenizer_eos if tokenizer_eos is not None else (stop_eos[0] if stop_eos else None)
    if primary_eos is not None and primary_eos not in stop_eos:
        stop_eos = (primary_eos, *stop_eos)

    bos = files.optional_int(config, "bos_token_id", config_file)
    if bos is None:
        bos = files.optional_int(generation, "bos_token_id", generation_file)

    config_vocab = files.optional_int(config, "vocab_size", config_file)
    vocab_size = max(config_vocab or 0, tokenizer.get_vocab_size(with_added_tokens=True))

    sampling_defaults = {
        key: float(value)
        for key in SAMPLING_DEFAULT_KEYS
        if isinstance(value := generation.get(key), int | float) and not isinstance(value, bool)
    }
    folder = ModelFolder(
        path=path,
        tokenizer_path=path,
        served_model_name=served_model_name or path.name,
        model_type=files.optional_str(config, "model_type", config_file) or "",
        architectures=tuple(files.str_list(config, "architectures", config_file)),
        max_context_length=files.context_length(config, config_file) or DEFAULT_MAX_CONTEXT_LENGTH,
        vocab_size=vocab_size,
        eos_token_ids=reported_eos,
        stop_eos_token_ids=stop_eos,
        primary_eos_token_id=primary_eos,
        bos_token_id=bos,
        pad_token_id=files.optional_int(config, "pad_token_id", config_file),
        sampling_defaults=sampling_defaults,
    )
    return folder, tokenizer
