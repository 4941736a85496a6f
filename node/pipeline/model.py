"""Model folders: the metadata the gateway needs from a Hugging Face-style model directory.

A folder holds tokenizer.json, tokenizer_config.json, config.json and (optionally) generation_config.json.
`load_model_folder` reads the small JSON files only; the tokenizer itself is loaded by
`node.pipeline.tokenizer.Tokenizer`.

The typed readers below (`read_json`, `optional_int`, `id_list`, ...) are also the simulated engine's
(node/sim/model_folder.py): one reading of a model folder's files, each error naming the file.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Final, TypeAlias

import msgspec

TOKENIZER_FILE: Final = "tokenizer.json"
TOKENIZER_CONFIG_FILE: Final = "tokenizer_config.json"
CONFIG_FILE: Final = "config.json"
GENERATION_CONFIG_FILE: Final = "generation_config.json"
# Newer transformers versions save the template beside tokenizer_config.json instead of inside it.
CHAT_TEMPLATE_FILE: Final = "chat_template.jinja"

# config.json keys that carry the context length, in the order vLLM tries them (`_get_and_verify_max_len`).
CONTEXT_LENGTH_KEYS: Final = (
    "max_position_embeddings",
    "n_positions",
    "max_seq_len",
    "seq_length",
    "max_sequence_length",
)

# transformers writes int(1e30) as model_max_length when a tokenizer declares no limit; anything this large
# means "unset", not a real context window.
_UNSET_MODEL_MAX_LENGTH: Final = 10**18

_Json: TypeAlias = Mapping[str, object]


class ModelFolderError(Exception):
    """A model folder is missing, incomplete or malformed; ``path`` is the offending file or folder."""

    def __init__(self, path: Path, reason: str) -> None:
        super().__init__(f"{path}: {reason}")
        self.path = path
        self.reason = reason


@dataclass(frozen=True, slots=True)
class ModelFolder:
    """What the gateway knows about one model before loading its tokenizer."""

    path: Path
    name: str  # the folder's name; the model id clients ask for
    chat_template: str | None = field(repr=False)
    bos_token: str | None
    eos_token: str | None
    add_bos_token: bool  # as declared; the tokenizer.json post-processor is what actually inserts it
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]  # every id that ends generation; generation_config's first
    max_context_length: int | None
    model_type: str | None
    architectures: tuple[str, ...]

    @property
    def tokenizer_path(self) -> Path:
        return self.path / TOKENIZER_FILE


def load_model_folder(path: Path | str) -> ModelFolder:
    """Read a model folder's metadata.

    Raises:
        ModelFolderError: the folder or a required file (tokenizer.json, tokenizer_config.json,
            config.json) is missing, or any file is unreadable, malformed JSON or has a field of the
            wrong type. The error names the file.
    """
    folder = Path(path)
    if not folder.is_dir():
        raise ModelFolderError(folder, "model folder does not exist")
    tokenizer_file = folder / TOKENIZER_FILE
    if not tokenizer_file.is_file():
        raise ModelFolderError(tokenizer_file, "missing")
    tok_cfg_file = folder / TOKENIZER_CONFIG_FILE
    tok_cfg = read_json(tok_cfg_file)
    config_file = folder / CONFIG_FILE
    config = read_json(config_file)
    gen_file = folder / GENERATION_CONFIG_FILE
    # Optional: many published folders have none, and config.json then carries the same ids.
    gen = read_json(gen_file, required=False)

    bos_token = token_content(tok_cfg, "bos_token", tok_cfg_file)
    eos_token = token_content(tok_cfg, "eos_token", tok_cfg_file)
    ids = _TokenIds(folder, tok_cfg)

    bos_token_id = ids.lookup(bos_token) if bos_token is not None else None
    if bos_token_id is None:
        bos_token_id = optional_int(gen, "bos_token_id", gen_file)
    if bos_token_id is None:
        bos_token_id = optional_int(config, "bos_token_id", config_file)

    eos_ids = id_list(gen, "eos_token_id", gen_file) if gen else id_list(config, "eos_token_id", config_file)
    eos_token_id = ids.lookup(eos_token) if eos_token is not None else None
    if eos_token_id is not None and eos_token_id not in eos_ids:
        eos_ids.append(eos_token_id)

    max_context = context_length(config, config_file)
    if max_context is None:
        declared = optional_int(tok_cfg, "model_max_length", tok_cfg_file)
        max_context = declared if declared is not None and declared < _UNSET_MODEL_MAX_LENGTH else None

    return ModelFolder(
        path=folder,
        name=folder.name,
        chat_template=_chat_template(folder, tok_cfg, tok_cfg_file),
        bos_token=bos_token,
        eos_token=eos_token,
        add_bos_token=_optional_bool(tok_cfg, "add_bos_token", tok_cfg_file) or False,
        bos_token_id=bos_token_id,
        eos_token_ids=tuple(eos_ids),
        max_context_length=max_context,
        model_type=optional_str(config, "model_type", config_file),
        architectures=tuple(str_list(config, "architectures", config_file)),
    )


class _TokenIds:
    """Resolves special-token strings to ids: from tokenizer_config's ``added_tokens_decoder`` when it has
    them (cheap), else by parsing tokenizer.json (~0.15 s for a 128k vocabulary, so only on demand)."""

    def __init__(self, folder: Path, tok_cfg: _Json) -> None:
        self._file = folder / TOKENIZER_FILE
        self._table: dict[str, int] = {}
        decoder = tok_cfg.get("added_tokens_decoder")
        if isinstance(decoder, Mapping):
            for key, token in decoder.items():
                if isinstance(token, Mapping) and isinstance(token.get("content"), str) and key.isdigit():
                    self._table[token["content"]] = int(key)
        self._parsed = False

    def lookup(self, content: str) -> int | None:
        if content not in self._table and not self._parsed:
            self._parse_tokenizer_json()
        return self._table.get(content)

    def _parse_tokenizer_json(self) -> None:
        self._parsed = True
        data = read_json(self._file)
        model = data.get("model")
        vocab = model.get("vocab") if isinstance(model, Mapping) else None
        if isinstance(vocab, Mapping):  # BPE/WordPiece: token -> id (Unigram stores a list; skip it)
            for token, token_id in vocab.items():
                if isinstance(token_id, int):
                    self._table.setdefault(token, token_id)
        added = data.get("added_tokens")
        if isinstance(added, list):  # added tokens win over the base vocabulary, as in the tokenizer
            for token in added:
                if isinstance(token, Mapping):
                    content, token_id = token.get("content"), token.get("id")
                    if isinstance(content, str) and isinstance(token_id, int):
                        self._table[content] = token_id


def read_json(file: Path, *, required: bool = True) -> _Json:
    """The JSON object in ``file``; an absent file that is not ``required`` reads as an empty one.

    Raises:
        ModelFolderError: the file is missing (and required), unreadable, not JSON or not an object.
    """
    if not required and not file.exists():
        return {}
    try:
        data = file.read_bytes()
    except FileNotFoundError as exc:
        raise ModelFolderError(file, "missing") from exc
    except OSError as exc:
        raise ModelFolderError(file, f"cannot read: {exc.strerror or exc}") from exc
    try:
        value = msgspec.json.decode(data)
    except msgspec.DecodeError as exc:
        raise ModelFolderError(file, f"malformed JSON: {exc}") from exc
    if not isinstance(value, dict):
        raise ModelFolderError(file, "expected a JSON object at the top level")
    return value


def token_content(data: _Json, key: str, file: Path) -> str | None:
    """A special token's text. Raises ModelFolderError for a value of another shape."""
    # Special tokens are stored either as plain strings or as serialized AddedToken objects.
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, Mapping) and isinstance(value.get("content"), str):
        content: str = value["content"]
        return content
    raise ModelFolderError(file, f"{key!r} must be a string or an object with 'content'")


def _chat_template(folder: Path, tok_cfg: _Json, file: Path) -> str | None:
    value = tok_cfg.get("chat_template")
    if isinstance(value, str):
        return value
    if isinstance(value, list):  # named templates: [{"name": "default", "template": "..."}, ...]
        for entry in value:
            if isinstance(entry, Mapping) and entry.get("name") == "default":
                template = entry.get("template")
                if isinstance(template, str):
                    return template
        return None
    if value is not None:
        raise ModelFolderError(file, "'chat_template' must be a string or a list of named templates")
    side_file = folder / CHAT_TEMPLATE_FILE
    if side_file.is_file():
        try:
            return side_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise ModelFolderError(side_file, f"cannot read: {exc}") from exc
    return None


def optional_int(data: _Json, key: str, file: Path) -> int | None:
    """``data[key]`` as an int (an integral float too), None when absent; raises ModelFolderError otherwise."""
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or value != int(value):
        raise ModelFolderError(file, f"{key!r} must be an integer")
    return int(value)


def _optional_bool(data: _Json, key: str, file: Path) -> bool | None:
    value = data.get(key)
    if value is None or isinstance(value, bool):
        return value
    raise ModelFolderError(file, f"{key!r} must be true or false")


def optional_str(data: _Json, key: str, file: Path) -> str | None:
    """``data[key]`` as a string, None when absent; raises ModelFolderError otherwise."""
    value = data.get(key)
    if value is None or isinstance(value, str):
        return value
    raise ModelFolderError(file, f"{key!r} must be a string")


def id_list(data: _Json, key: str, file: Path) -> list[int]:
    """An id field that may be one int or a list of ints (Hugging Face allows both), de-duplicated in order.

    Raises ModelFolderError for anything else."""
    value = data.get(key)
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    ids = [item for item in items if isinstance(item, int) and not isinstance(item, bool)]
    if len(ids) != len(items):
        raise ModelFolderError(file, f"{key!r} must be an integer or a list of integers")
    return list(dict.fromkeys(ids))  # de-duplicated, order kept


def str_list(data: _Json, key: str, file: Path) -> list[str]:
    """A list of strings, [] when absent; raises ModelFolderError otherwise."""
    value = data.get(key)
    if value is None:
        return []
    items = value if isinstance(value, list) else [value]
    strings = [item for item in items if isinstance(item, str)]
    if not isinstance(value, list) or len(strings) != len(items):
        raise ModelFolderError(file, f"{key!r} must be a list of strings")
    return strings


def context_length(config: _Json, file: Path) -> int | None:
    """The context window config.json declares (the first positive of CONTEXT_LENGTH_KEYS), or None."""
    for key in CONTEXT_LENGTH_KEYS:
        value = optional_int(config, key, file)
        if value is not None and value > 0:
            return value
    return None
