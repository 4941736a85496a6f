"""NFC as Hugging Face ``tokenizers`` applies it, done with Python's `unicodedata` where the two agree.

Qwen's tokenizer.json NFC-normalizes text before its byte-level BPE; the fast encoder (`bpe_fast`) can
normalize first and then run tiktoken, provided Python's NFC equals Hugging Face's on the text. The two
implement the same algorithm from different Unicode versions (Python 3.11: 14.0; the ``tokenizers`` crate
its own). Unicode's stability policy keeps NFC of text made of characters assigned in both versions
identical (a new composite of existing characters is a composition exclusion). So they can differ only on
characters whose decomposition differs between the two tables, on characters one side does not know
(new ones with a decomposition), and on the components of such decompositions. `unsafe_characters` finds
those by asking both sides for the NFD of every code point that could be one (once per process, ~0.1 s);
a text holding any of them is left to Hugging Face.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Mapping
from typing import Any, Final

from tokenizers import normalizers

# Code points worth asking about: everything past ASCII in planes 0-3 and plane 14. Planes 4-13 hold no
# assigned character in any Unicode version to date (16.0), nor do planes 15-16 (private use).
_RANGES: Final = ((0x80, 0xD800), (0xE000, 0x40000), (0xE0000, 0xF0000))
# NUL never composes with anything, so it keeps every code point's normalization apart in one call.
_SEPARATOR: Final = "\x00"


def is_nfc_only(normalizer: Mapping[str, Any] | None) -> bool:
    """True when a tokenizer.json normalizer is NFC alone (possibly inside Sequences)."""
    if normalizer is None:
        return False
    if normalizer.get("type") == "NFC":
        return True
    if normalizer.get("type") != "Sequence":
        return False
    members = [m for m in normalizer.get("normalizers") or () if not _is_empty(m)]
    return len(members) == 1 and is_nfc_only(members[0])


def _is_empty(node: Mapping[str, Any]) -> bool:
    return node.get("type") == "Sequence" and all(_is_empty(m) for m in node.get("normalizers") or ())


@functools.cache
def _unsafe() -> frozenset[str]:
    chars = [chr(c) for start, end in _RANGES for c in range(start, end)]
    theirs = normalizers.NFD().normalize_str(_SEPARATOR.join(chars)).split(_SEPARATOR)
    unsafe: set[str] = set()
    for char, their in zip(chars, theirs, strict=True):
        ours = unicodedata.normalize("NFD", char)
        if ours != their:
            unsafe.update(char, ours, their)
    unsafe.discard(_SEPARATOR)
    return frozenset(unsafe)  # single characters: update() took each string's characters


@functools.cache
def unsafe_characters() -> re.Pattern[str]:
    """A pattern matching every character on which Python's NFC might differ from Hugging Face's."""
    unsafe = _unsafe()
    if not unsafe:
        return re.compile("(?!)")  # matches nothing
    return re.compile("[" + "".join(re.escape(c) for c in sorted(unsafe)) + "]")


@functools.cache
def suspects() -> frozenset[int]:
    """Code points whose presence means a text may not be in NFC, or may normalize differently in Hugging Face:
    a superset of NFC_Quick_Check No/Maybe (characters NFC changes; combining marks, which may reorder or
    compose; the second character of every canonical pair, e.g. Indic vowel signs; Hangul medial and final
    jamo) and the `unsafe_characters`. A text without any is in NFC: NFC leaves it as it is, on both sides.
    ~0.3 s once per process."""
    found: set[int] = set()
    for start, end in _RANGES:
        for code in range(start, end):
            char = chr(code)
            if unicodedata.combining(char) or unicodedata.normalize("NFC", char) != char:
                found.add(code)
            decomposition = unicodedata.decomposition(char)
            if decomposition and not decomposition.startswith("<"):
                parts = decomposition.split()
                if len(parts) == 2:
                    found.add(int(parts[1], 16))
    found.update(range(0x1161, 0x1176))  # Hangul vowels (V) and trailing consonants (T) compose by rule
    found.update(range(0x11A8, 0x11C3))
    found.update(map(ord, _unsafe()))
    return frozenset(found)


def normalize(text: str) -> str:
    """``text`` in NFC (exactly Hugging Face's when `unsafe_characters` finds nothing in it)."""
    return unicodedata.normalize("NFC", text)


def is_normalized(text: str) -> bool:
    return unicodedata.is_normalized("NFC", text)
