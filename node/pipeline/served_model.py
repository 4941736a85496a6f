"""A model as the gateway serves it: its folder, tokenizer, chat template and limits, loaded once."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from node.config import TokenizerCacheConfig
from node.pipeline.model import ModelFolder, load_model_folder
from node.pipeline.parsers.detect import detect_parsers
from node.pipeline.parsing import AUTO, ModelParsers, resolve_parsers
from node.pipeline.template import ChatTemplate
from node.pipeline.tokenizer import Tokenizer

if TYPE_CHECKING:
    from node.models.parses import TokenizerParses

# A folder that declares no context length: assume a modest window rather than unlimited.
DEFAULT_CONTEXT_LENGTH = 4096

# generation_config.json keys that are sampling defaults (as vLLM's OpenAI server applies them): a request that
# leaves one unset gets the model author's value, not the engine's neutral default.
SAMPLING_DEFAULT_KEYS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")


def read_sampling_defaults(folder: Path) -> dict[str, float]:
    """Sampling defaults from ``generation_config.json`` (absent file or keys: none)."""
    try:
        data = json.loads((folder / "generation_config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {
        k: float(v)
        for k in SAMPLING_DEFAULT_KEYS
        if isinstance(v := data.get(k), int | float) and not isinstance(v, bool)
    }


@dataclass(frozen=True, slots=True)
class ServedModel:
    name: str
    aliases: frozenset[str]
    folder: ModelFolder
    tokenizer: Tokenizer
    template: ChatTemplate | None
    max_context_length: int
    eos_token_ids: frozenset[int]
    created: int
    sampling_defaults: Mapping[str, float] = field(default_factory=dict)
    parsers: ModelParsers = field(default_factory=ModelParsers)

    def answers_to(self, requested: str) -> bool:
        return requested == self.name or requested in self.aliases


def load_served_model(
    model_path: str,
    *,
    served_name: str,
    chat_template_file: str = "",
    context_length: int | None = None,
    extra_eos_ids: tuple[int, ...] = (),
    tokenizer_cache: TokenizerCacheConfig | None = None,
    tool_call_parser: str = AUTO,
    reasoning_parser: str = AUTO,
    tokenizer_parses: TokenizerParses | None = None,
) -> ServedModel:
    """Load a model folder. ``tool_call_parser`` / ``reasoning_parser``: vLLM's parser names, ``auto``
    (detected from the folder) or ``none``; ``tokenizer_parses``: tokenizer.json parses shared with other
    loaders in this process. Raises ModelFolderError (names the file), TemplateError (bad
    template) or UnknownParserError (a ValueError)."""
    folder = load_model_folder(model_path)
    tokenizer = (
        Tokenizer.from_file(folder.tokenizer_path, cache=tokenizer_cache, parses=tokenizer_parses)
        if tokenizer_cache is not None
        else Tokenizer.from_file(folder.tokenizer_path, parses=tokenizer_parses)
    )
    source = Path(chat_template_file).read_text(encoding="utf-8") if chat_template_file else folder.chat_template
    template = (
        ChatTemplate(source, bos_token=folder.bos_token, eos_token=folder.eos_token) if source is not None else None
    )
    name = served_name or folder.name
    # Detected from the template actually served (an override included) and the tokenizer's added tokens.
    added = [token.content for token in tokenizer.raw.get_added_tokens_decoder().values()]
    detected = detect_parsers(source or "", added)
    parsers = resolve_parsers(
        tokenizer,
        tool=tool_call_parser,
        reasoning=reasoning_parser,
        detected_tool=detected.tool_parser,
        detected_reasoning=detected.reasoning_parser,
    )
    aliases = frozenset({folder.name, str(folder.path), model_path} - {name})
    return ServedModel(
        name=name,
        aliases=aliases,
        folder=folder,
        tokenizer=tokenizer,
        template=template,
        max_context_length=context_length or folder.max_context_length or DEFAULT_CONTEXT_LENGTH,
        eos_token_ids=frozenset(folder.eos_token_ids) | frozenset(extra_eos_ids),
        created=int(time.time()),
        sampling_defaults=read_sampling_defaults(folder.path),
        parsers=parsers,
    )
