"""A Hugging Face tokenizer.json built from a tiktoken rank file (``base64-token rank`` per line).

tiktoken's BPE merges any adjacent pair whose concatenation is a token, lowest rank first. Hugging Face's
BPE merges only listed pairs, lowest list position first. Listing *every* split ``(a, b)`` of every token
``t`` with both halves in the vocabulary, ordered by ``rank(t)``, makes the two agree: the pairs tiktoken
may merge are exactly the listed ones, in the same priority. (Pairs forming the same token tie in tiktoken,
which takes the leftmost; the list orders them by their halves' ranks. The two coincide on real text —
the tests compare ids with tiktoken itself on a corpus.)
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final


@dataclass(frozen=True, slots=True)
class SpecialToken:
    id: int
    content: str
    special: bool  # False: an added token that survives skip_special_tokens (Qwen's <tool_call>, <think>)


def _byte_to_unicode() -> dict[int, str]:
    """GPT-2's table: printable bytes stand for themselves, the others for U+0100 onwards."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {b: chr(b) for b in printable}
    shifted = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + shifted)
            shifted += 1
    return table


_BYTE_TO_UNICODE: Final = _byte_to_unicode()


def read_ranks(data: bytes) -> dict[bytes, int]:
    """Parse a tiktoken rank file.

    Raises:
        ValueError: a line is not ``base64 rank``, or ranks are not 0..n-1 without gaps or repeats.
    """
    ranks: dict[bytes, int] = {}
    for number, line in enumerate(data.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"rank file line {number}: expected 'base64 rank'")
        ranks[base64.b64decode(parts[0], validate=True)] = int(parts[1])
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError("rank file: ranks are not 0..n-1, each once")
    return ranks


def _unicode(token: bytes) -> str:
    return "".join(_BYTE_TO_UNICODE[b] for b in token)


def tokenizer_json(
    ranks: Mapping[bytes, int], split_pattern: str, specials: Sequence[SpecialToken], *, nfc: bool
) -> dict[str, object]:
    """The tokenizer.json (as a dict) of a byte-level BPE with ``ranks`` as token ids, splitting text with
    ``split_pattern`` (a Hugging Face ``Split`` regex), ``specials`` as added tokens, and an NFC normalizer
    when ``nfc``."""
    merges: list[tuple[int, int, int, str]] = []
    for token, rank in ranks.items():
        for cut in range(1, len(token)):
            left, right = token[:cut], token[cut:]
            left_rank, right_rank = ranks.get(left), ranks.get(right)
            if left_rank is not None and right_rank is not None:
                merges.append((rank, left_rank, right_rank, f"{_unicode(left)} {_unicode(right)}"))
    merges.sort()
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": s.id,
                "content": s.content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": s.special,
            }
            for s in specials
        ],
        "normalizer": {"type": "NFC"} if nfc else None,
        "pre_tokenizer": {
            "type": "Sequence",
            "pretokenizers": [
                {"type": "Split", "pattern": {"Regex": split_pattern}, "behavior": "Isolated", "invert": False},
                byte_level,
            ],
        },
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {_unicode(token): rank for token, rank in ranks.items()},
            "merges": [merge for *_, merge in merges],
        },
    }
