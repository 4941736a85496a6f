"""What a tokenizer's encode does, established once at load: the facts the fast encoder and the prefix
cache rely on, each derived from tokenizer.json and then confirmed on the probe corpus rather than assumed.

- `post_processor_affixes`: with ``add_special_tokens=True`` the post-processor only puts constant ids
  around the text (a BOS, a CLS/SEP pair), so ``encode(t, True) == prefix + encode(t, False) + suffix``.
- `segmentation_hazard`: cutting a text right after an added token and encoding the pieces separately
  gives the same ids as encoding it whole. Hugging Face extracts added tokens before normalizing and
  pre-tokenizing, and every later stage works piece by piece, so this holds unless a stage looks at where
  a piece sits in the original text (Metaspace ``prepend_scheme="first"`` adds ``▁`` only at offset 0),
  added tokens absorb neighbouring whitespace (lstrip/rstrip), or truncation/padding is configured.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from node.pipeline.special_tokens import AddedToken, AddedTokenMatcher, matching_problem

EncodeFn = Callable[[str, bool], list[int]]  # (text, add_special_tokens) -> ids

# Normalizers and pre-tokenizers known to work on each piece on its own (Hugging Face runs them on the
# pieces between added tokens). Anything else is treated as a hazard until shown otherwise.
_PIECEWISE_NORMALIZERS: Final = frozenset(
    {
        "BertNormalizer",
        "ByteLevel",
        "Lowercase",
        "NFC",
        "NFD",
        "NFKC",
        "NFKD",
        "Nmt",
        "Precompiled",
        "Prepend",
        "Replace",
        "Sequence",
        "Strip",
        "StripAccents",
    }
)
_PIECEWISE_PRE_TOKENIZERS: Final = frozenset(
    {
        "BertPreTokenizer",
        "ByteLevel",
        "CharDelimiterSplit",
        "Digits",
        "FixedLength",
        "Metaspace",
        "Punctuation",
        "Sequence",
        "Split",
        "UnicodeScripts",
        "Whitespace",
        "WhitespaceSplit",
    }
)
# Post-processors that can only add constant ids at the ends of a single sequence.
_AFFIX_POST_PROCESSORS: Final = frozenset(
    {"BertProcessing", "ByteLevel", "RobertaProcessing", "Sequence", "TemplateProcessing"}
)


@dataclass(frozen=True, slots=True)
class Affixes:
    """The ids ``add_special_tokens=True`` puts before and after the text."""

    prefix: tuple[int, ...]
    suffix: tuple[int, ...]

    def wrap(self, ids: list[int]) -> list[int]:
        if self.prefix:
            ids[:0] = self.prefix
        if self.suffix:
            ids.extend(self.suffix)
        return ids

    def wrap_array(self, ids: array[int]) -> array[int]:
        """`wrap` for an array of ids (a new one when there is something to add)."""
        if not self.prefix and not self.suffix:
            return ids
        wrapped = array(ids.typecode, self.prefix)
        wrapped += ids
        wrapped.extend(self.suffix)
        return wrapped


def read_added_tokens(raw: Any) -> tuple[AddedToken, ...]:
    """The added tokens Hugging Face splits out of text, in id order. A special token is not split out
    when the tokenizer has ``encode_special_tokens`` set."""
    skip_special = bool(getattr(raw, "encode_special_tokens", False))
    return tuple(
        AddedToken(
            content=t.content,
            id=token_id,
            special=t.special,
            normalized=t.normalized,
            lstrip=t.lstrip,
            rstrip=t.rstrip,
            single_word=t.single_word,
        )
        for token_id, t in sorted(raw.get_added_tokens_decoder().items())
        if not (skip_special and t.special)
    )


def components(node: object, key: str) -> Iterable[Mapping[str, Any]]:
    """A normalizer/pre-tokenizer/post-processor definition and, for a Sequence, its members, depth first."""
    if not isinstance(node, Mapping):
        return
    yield node
    for child in node.get(key, ()) or ():
        yield from components(child, key)


def normalizer_is_identity(definition: Mapping[str, Any]) -> bool:
    """True when tokenizer.json declares no normalizer, or only empty Sequences."""
    return all(c.get("type") == "Sequence" for c in components(definition.get("normalizer"), "normalizers"))


def post_processor_affixes(definition: Mapping[str, Any], encode: EncodeFn, probes: Sequence[str]) -> Affixes | None:
    """The constant ids the post-processor adds, or None if it is not affix-only on every probe."""
    for c in components(definition.get("post_processor"), "processors"):
        if c.get("type") not in _AFFIX_POST_PROCESSORS:
            return None
    around = encode("", True)  # prefix + suffix: an empty text encodes to no ids of its own
    if encode("", False):
        return None
    affixes: Affixes | None = None
    for text in probes:
        plain, full = encode(text, False), encode(text, True)
        if len(full) != len(plain) + len(around):
            return None
        if affixes is None and plain:  # an empty text cannot tell a prefix from a suffix
            cut = _prefix_length(full, plain, around)
            if cut is None:
                return None
            affixes = Affixes(tuple(around[:cut]), tuple(around[cut:]))
        if affixes is not None and full != affixes.wrap(list(plain)):
            return None
    return affixes if affixes is not None else Affixes(tuple(around), ())


def _prefix_length(full: list[int], plain: list[int], around: list[int]) -> int | None:
    for cut in range(len(around) + 1):
        if full[:cut] == around[:cut] and full[cut : cut + len(plain)] == plain:
            return cut
    return None


def segmentation_hazard(
    definition: Mapping[str, Any],
    raw: Any,
    *,
    matcher: AddedTokenMatcher,
    affixes: Affixes | None,
    encode: EncodeFn,
    probes: Sequence[str],
) -> str | None:
    """Why encoding a text in pieces cut after added tokens could change its ids, or None if it cannot.

    The structural reasons are checked first; then every cut of every probe text is tried.
    """
    if affixes is None:
        return "the post-processor does more than add ids around the text"
    if raw.truncation is not None or raw.padding is not None:
        return "truncation or padding is configured"
    problem = matching_problem(matcher.tokens)
    if problem is not None:
        return problem
    for c in components(definition.get("normalizer"), "normalizers"):
        if c.get("type") not in _PIECEWISE_NORMALIZERS:
            return f"normalizer {c.get('type')!r} is not known to work piece by piece"
    for c in components(definition.get("pre_tokenizer"), "pretokenizers"):
        kind = c.get("type")
        if kind not in _PIECEWISE_PRE_TOKENIZERS:
            return f"pre-tokenizer {kind!r} is not known to work piece by piece"
        if kind == "Metaspace" and c.get("prepend_scheme") == "first":
            return "Metaspace prepend_scheme 'first' marks only the start of the text, not of a suffix"
    for text in probes:
        cuts = matcher.boundaries(text)
        if not cuts:
            continue
        whole = encode(text, False)
        pieces: list[int] = []
        for start, end in zip([0, *cuts], [*cuts, len(text)], strict=True):
            if start < end:
                pieces.extend(encode(text[start:end], False))
        if pieces != whole:
            return f"encoding in pieces changed the ids of probe text {text[:40]!r}"
    return None
