"""The native encoder (`_bytebpe.c`) for tokenizers that split with the Qwen2 or the Llama-3 regex.

Those two regexes (Llama-3's is OpenAI's cl100k split) cover Qwen2/2.5/3 and Llama 3.x. tiktoken runs them
through fancy_regex, which costs about half of its encode; `_bytebpe` runs them as hand-written code over
the UTF-8 text and merges with tiktoken's own algorithm (remembering merged words), so its ids are
tiktoken's: on distinct ~7,800-token texts, in process (`python -m bench.encoder_bench`), 3.6x faster than
tiktoken on English prose, 4.1x on source code, 2.8x on Latin-script text with diacritics, 7x on JSON, but
5-11 % slower on CJK, where merging long runs of ideographs dominates (pair-id merges would be the fix).
It also finds the tokenizer's added tokens itself, and for an NFC tokenizer declines (returns None for) any
text that may not be in NFC, so the common case is one call.

The character classes it needs (letter, number, white space) come from tiktoken's regex engine itself, one
call per class over every code point (~0.15 s, once per process): the two agree on every character
whatever Unicode version each was built with. (They also agree with Hugging Face's Oniguruma on every
code point for the installed versions; tests/pipeline/test_bpe_native.py checks both.)

Only a tokenizer whose pre-tokenizer is exactly one of the two regexes takes this path, and `bpe_fast.build`
still compares its ids with Hugging Face's on the probe corpus before using it; any other pattern keeps
tiktoken, as does an install where the extension could not be compiled (it is optional in pyproject.toml).
"""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from itertools import chain
from typing import Final

import tiktoken

from node.pipeline import nfc

try:
    from node.pipeline import _bytebpe

    _BUILT = True
except ImportError:  # installed without a C compiler: tiktoken encodes instead
    _BUILT = False

# The regexes of the pre-tokenizer's one Split step (followed by ByteLevel without its own regex), exactly as
# Qwen2's and Llama-3's tokenizer.json write them; the value is how many digits one number piece takes.
QWEN2_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
LLAMA3_SPLIT: Final = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
    r"|\s+(?!\S)|\s+"
)
_DIGIT_RUNS: Final = {QWEN2_SPLIT: 1, LLAMA3_SPLIT: 3}
_CODE_POINTS: Final = 0x110000


def available() -> bool:
    """Whether the extension was compiled at install."""
    return _BUILT


@functools.cache
def character_classes() -> bytes:
    """One byte per code point, the `_bytebpe` class bits (L, N, WS) as tiktoken's regex engine sees them.
    Surrogates are left unclassified: texts holding one never reach an encoder (`bpe_fast` routes them)."""
    if not _BUILT:
        raise RuntimeError("the native encoder is not built")
    every = "".join(map(chr, chain(range(0xD800), range(0xE000, _CODE_POINTS))))
    single_bytes = {bytes([b]): b for b in range(256)}
    table = bytearray(_CODE_POINTS)
    for bit, pattern in ((_bytebpe.L, r"\p{L}"), (_bytebpe.N, r"\p{N}"), (_bytebpe.WS, r"\s")):
        # Only matches are encoded, each to its own bytes: the ids spell out the characters of the class.
        probe = tiktoken.Encoding("classes", pat_str=pattern, mergeable_ranks=single_bytes, special_tokens={})
        for ch in bytes(probe.encode_ordinary(every)).decode("utf-8"):
            table[ord(ch)] |= bit
    return bytes(table)


@functools.cache
def _nfc_classes() -> bytes:
    """`character_classes` with SLOW on every `nfc.suspects` character: for a tokenizer that normalizes to NFC,
    a text holding none is in NFC already, so the encoder takes it as it is; any other text is returned to
    `bpe_fast`, which normalizes it (or leaves it to Hugging Face)."""
    table = bytearray(character_classes())
    for code in nfc.suspects():
        table[code] |= _bytebpe.SLOW
    return bytes(table)


def build(
    patterns: Sequence[str],
    ranks: Mapping[bytes, int],
    *,
    added: Mapping[str, int] | None = None,
    normalizes: bool = False,
) -> _bytebpe.Encoder | str:
    """The native encoder for a tokenizer that splits with ``patterns`` (its Split regexes, in order) and
    merges by ``ranks``, or why there is none. ``added``: tokens matched leftmost-longest in one scan before
    splitting (pass them only when that is how Hugging Face finds them). ``normalizes``: the tokenizer
    NFC-normalizes, so texts that may not be in NFC come back as None from `encode`."""
    if not _BUILT:
        return "the native encoder is not built (no C compiler at install)"
    if len(patterns) != 1 or patterns[0] not in _DIGIT_RUNS:
        return "the split regex is neither Qwen2's nor Llama-3's"
    classes = _nfc_classes() if normalizes else character_classes()
    return _bytebpe.Encoder(dict(ranks), classes, _DIGIT_RUNS[patterns[0]], dict(added or {}))
