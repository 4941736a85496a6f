"""Deterministic, distinct English prompts of a given Llama-3 token length (no downloads).

Sentences come from embedded word classes and sentence shapes, drawn with a seeded `random.Random`, so the
same seed gives the same text on every machine. A pool holds a few bodies per size; each request's text is
``"Request <n>." + body`` with a number unique in the whole run, so no whole-prompt cache (tokenizer cache,
response cache) can help either gateway, while the chat-template header every real prompt shares stays shared.

The size is that of the whole chat-templated prompt the worker sees (what ``usage.prompt_tokens`` reports),
measured with the model folder's own tokenizer and chat template; the request number's width moves it by a
token or two.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer


def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


NOUNS = _words(
    "river garden engine teacher window mountain library market village letter kitchen student "
    "harbor forest bridge doctor farmer island painter station journey machine city storm question "
    "answer story morning evening winter summer pilot captain museum theater bakery lantern compass "
    "valley desert ocean neighbor friend council report budget musician road tower field "
    "orchard school factory planet signal record clock mirror"
)
ADJECTIVES = _words(
    "quiet bright ancient careful small large patient curious distant gentle heavy narrow simple "
    "strange warm cold busy empty famous honest modern early late green silver golden hidden open "
    "steady rapid"
)
VERBS = _words(
    "carried painted visited repaired described followed opened measured watched built crossed "
    "studied answered collected moved reached cleaned noticed explained prepared counted protected "
    "shared remembered tested finished"
)
ADVERBS = _words(
    "slowly quickly carefully quietly often rarely suddenly finally gladly nearly always never softly openly calmly"
)
PREPOSITIONS = _words("near behind beside across under above inside around beyond along")
DETERMINERS = _words("the a every one that this another each")
CONNECTORS = ("and then", "while", "because", "before", "after", "although", "so")

# Sentence shapes: each slot names a word class; the first letter is capitalized afterwards.
SHAPES = (
    "the {adj} {noun} {verb} {det} {noun} {prep} the {noun}.",
    "{det} {noun} {adv} {verb} {det} {adj} {noun}.",
    "in the {adj} {noun}, {det} {noun} {verb} {det} {noun} {con} the {noun} {verb} {det} {adj} {noun}.",
    "the {noun} {prep} the {noun} {adv} {verb} {det} {noun}.",
    "{det} {adj} {noun} {verb} the {noun}, {con} {det} {noun} {adv} {verb} {det} {noun} {prep} the {noun}.",
    "nobody {verb} the {adj} {noun} {prep} {det} {adj} {noun}.",
)

_CLASSES: dict[str, tuple[str, ...]] = {
    "noun": NOUNS,
    "adj": ADJECTIVES,
    "verb": VERBS,
    "adv": ADVERBS,
    "prep": PREPOSITIONS,
    "det": DETERMINERS,
    "con": CONNECTORS,
}

# The widest request number a run uses; the prefix is sized with it so longer numbers never overshoot.
_NUMBER_FOR_SIZING = 1_000_000


def request_prefix(number: int) -> str:
    """The distinct start of request ``number``'s text."""
    return f"Request {number}."


def sentences(rng: random.Random) -> Iterator[str]:
    """An endless stream of English sentences drawn with ``rng``."""
    while True:
        shape = rng.choice(SHAPES)
        words = []
        for token in shape.split(" "):
            if token.startswith("{"):
                end = token.index("}")
                words.append(rng.choice(_CLASSES[token[1:end]]) + token[end + 1 :])
            else:
                words.append(token)
        text = " ".join(words)
        yield text[0].upper() + text[1:]


def load_tokenizer(model_dir: Path) -> Tokenizer:
    return Tokenizer.from_file(str(model_dir / "tokenizer.json"))


def chat_template_overhead(model_dir: Path, tokenizer: Tokenizer) -> int:
    """Tokens the chat template adds around one user message (with the generation prompt)."""
    config: dict[str, Any] = json.loads((model_dir / "tokenizer_config.json").read_text("utf-8"))
    bos = config.get("bos_token") or ""
    if isinstance(bos, dict):
        bos = bos.get("content", "")

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    rendered = env.from_string(config["chat_template"]).render(
        messages=[{"role": "user", "content": "x"}], add_generation_prompt=True, bos_token=bos
    )
    return len(tokenizer.encode(rendered, add_special_tokens=False).ids) - len(
        tokenizer.encode("x", add_special_tokens=False).ids
    )


@dataclass(frozen=True, slots=True)
class PromptPool:
    """A few distinct bodies of one size; `text` makes request ``n``'s unique user message."""

    target_tokens: int
    bodies: tuple[str, ...]
    prompt_tokens: tuple[int, ...]  # measured size of each body's full templated prompt (widest number)

    def text(self, number: int) -> str:
        return request_prefix(number) + self.bodies[number % len(self.bodies)]

    @property
    def mean_prompt_tokens(self) -> float:
        return sum(self.prompt_tokens) / len(self.prompt_tokens)


def build_pool(tokenizer: Tokenizer, overhead_tokens: int, target_tokens: int, count: int, seed: int = 0) -> PromptPool:
    """``count`` distinct bodies whose templated prompt is ``target_tokens`` long (within a sentence).

    Llama-3's pre-tokenizer splits before each word's leading space, so a text's length is the sum of its
    sentences' lengths (each tokenized with its leading space); the final encode checks that.
    """
    prefix = request_prefix(_NUMBER_FOR_SIZING)
    fixed = overhead_tokens + len(tokenizer.encode(prefix, add_special_tokens=False).ids)
    budget = target_tokens - fixed
    if budget < 8:
        raise ValueError(f"target of {target_tokens} tokens leaves no room for a body (overhead {fixed})")
    bodies: list[str] = []
    measured: list[int] = []
    for index in range(count):
        body = sized_text(tokenizer, random.Random(f"{seed}/{target_tokens}/{index}"), budget)
        bodies.append(body)
        measured.append(fixed + len(tokenizer.encode(body, add_special_tokens=False).ids))
    return PromptPool(target_tokens=target_tokens, bodies=tuple(bodies), prompt_tokens=tuple(measured))


def sized_text(tokenizer: Tokenizer, rng: random.Random, budget: int) -> str:
    """Whole sentences drawn with ``rng``, each with a leading space, adding up to at most ``budget`` tokens
    (at least one sentence, even if it alone is longer)."""
    stream = sentences(rng)
    parts: list[str] = []
    used = 0
    while True:
        batch = [" " + next(stream) for _ in range(32)]
        for part, encoding in zip(batch, tokenizer.encode_batch(batch, add_special_tokens=False), strict=True):
            size = len(encoding.ids)
            if parts and used + size > budget:
                return "".join(parts)  # the next sentence would overshoot: stop just below the target
            parts.append(part)
            used += size
