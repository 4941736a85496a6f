"""An exact tiktoken encoder built in-process from a byte-level BPE tokenizer.json.

tiktoken encodes 5-10x faster than Hugging Face ``tokenizers`` and releases the GIL, but it implements one
kind of tokenizer: split with one regex, then merge adjacent byte sequences by the rank of the merged token,
with special tokens matched first. A tokenizer.json qualifies when its pipeline says exactly that:

- model: BPE over the GPT-2 byte alphabet (every vocabulary entry maps to bytes through the GPT-2
  byte<->unicode table; all 256 single bytes present), no dropout, no subword prefixes/suffixes;
- merge priority equals token rank: merge ``i`` produces a token whose id is >= that of merge ``i-1``, so
  "lowest merge index first" (Hugging Face) and "lowest merged-token id first" (tiktoken) order pairs
  alike. tiktoken also merges pairs the merge list lacks if they form a vocabulary token; that never
  happens when every token is reachable from its own bytes by the listed merges (then any adjacent pair
  forming a token in a reachable state is a listed merge). Trained vocabularies have that property
  (checked offline for all of Llama-3's and DeepSeek's tokens; ~1 s per 128k tokens, so not at load).
  With reachability, tiktoken's whole-piece lookup equals Hugging Face's ``ignore_merges`` either way.
- no normalizer that changes text, or NFC alone (`nfc`: a text not already in NFC is split at added
  tokens, as Hugging Face does before normalizing, and each piece is normalized; a text holding a
  character on which Python's and Hugging Face's Unicode tables could differ goes to Hugging Face; added
  tokens must then all be matched on the raw text, ``normalized=False``);
- pre-tokenizer: ``Split`` regexes (``Isolated``) then ByteLevel without
  a prefix space, or ByteLevel with its GPT-2 regex, expressible as one regex (`split_regex.compose`);
- added tokens without lstrip/rstrip/single_word (`special_tokens.matching_problem`). When one
  leftmost scan finds them where Hugging Face's two passes do (`special_tokens.single_pass_problem`),
  tiktoken matches them itself in one call; otherwise `special_tokens.AddedTokenMatcher` splits the
  text and the pieces between added tokens go to ``encode_ordinary``.

For the split regexes of Qwen2 and Llama-3, `bpe_native`'s C encoder takes tiktoken's place for the text
(same ids, 3-7x faster on most text; verified against Hugging Face here like tiktoken); tiktoken remains for
every other regex and where the extension was not built.

Structure is necessary, not sufficient (regex engines differ in corner cases), so `build` also compares
ids with Hugging Face on the probe corpus and declines on any difference.

One tiktoken encoding per thread: tiktoken's split regex (fancy-regex over regex-automata) keeps its match
scratch space in pools whose fast path serves only the first thread that ever used them, the one that
verified the encoder at load; every other thread takes a mutex and a stack push per regex match (one match
per pre-token, ~1 per 4 characters). That made long prompts encode ~20 % slower on the CPU pool's threads,
and put ~1.5 % of a short request's CPU into the pool's slow path on the event loop's thread, which encodes
short prompts inline but never loads a model. So the loading thread keeps the verified encoding and every
other thread that encodes gets its own copy (~0.1 s and ~21 MB for Llama-3, once per thread), whose pools it
owns: the CPU pool's threads (at most `CpuPool`'s size) and the event loop's, warmed before the node serves
(`FastBpeEncoder.warm_this_thread`).
"""

from __future__ import annotations

import enum
import re
import threading
from array import array
from collections.abc import Callable, Mapping, Sequence
from itertools import islice
from operator import le, methodcaller
from typing import TYPE_CHECKING, Any, Final

import tiktoken

from node.pipeline import bpe_native, nfc
from node.pipeline.special_tokens import (
    AddedToken,
    AddedTokenMatcher,
    longest_match_pattern,
    matching_problem,
    single_pass_problem,
)
from node.pipeline.split_regex import GPT2_PATTERN, UnsupportedPattern, compose

if TYPE_CHECKING:
    from node.pipeline import _bytebpe  # optional extension (bpe_native)

_SURROGATE: Final = re.compile("[\ud800-\udfff]")
_NONE_ALLOWED: Final[set[str]] = set()  # never mutated: tiktoken only reads it


class _Route(enum.Enum):
    """How a text is encoded when tiktoken cannot take it whole in one call."""

    FALLBACK = "fallback"  # Hugging Face
    PIECES = "pieces"  # added tokens matched here, the text between them by tiktoken
    PIECES_NFC = "pieces_nfc"  # as PIECES, each piece NFC-normalized first


def _gpt2_unicode_to_byte() -> dict[str, int]:
    """GPT-2's byte<->unicode table, inverted: printable bytes map to themselves, the rest to U+0100+."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    table = {chr(b): b for b in printable}
    shifted = 0
    for b in range(256):
        if b not in printable:
            table[chr(256 + shifted)] = b
            shifted += 1
    return table


class FastBpeEncoder:
    """Encodes like the Hugging Face tokenizer it was verified against, without the post-processor
    (callers add `encode_rules.Affixes`). Immutable; safe to share across threads."""

    __slots__ = (
        "_added",
        "_encoding",
        "_fallback",
        "_local",
        "_matcher",
        "_native",
        "_nfc_unsafe",
        "_plain_only",
        "_present",
        "native_reason",
    )

    def __init__(
        self,
        encoding: tiktoken.Encoding,
        matcher: AddedTokenMatcher,
        fallback: Callable[[str], list[int]],
        *,
        single_pass: bool,
        nfc_unsafe: re.Pattern[str] | None = None,
        native: _bytebpe.Encoder | None = None,
    ) -> None:
        """``nfc_unsafe``: set when the tokenizer NFC-normalizes; matches the characters left to
        ``fallback`` (`nfc.unsafe_characters`). ``native``: encodes the text between added tokens in
        place of ``encoding`` (`bpe_native`; same ids, faster)."""
        self._encoding = encoding
        self._local = threading.local()  # .encoding: this thread's own copy (see the module docstring)
        self._matcher = matcher
        self._fallback = fallback
        # One leftmost-longest scan finds the added tokens where Hugging Face's passes do (single pass).
        self._added = re.compile(longest_match_pattern(matcher.ids)) if single_pass and matcher.ids else None
        # tiktoken converts the allowed-special set on every call: ~50 us for 256 tokens, ~250 us for
        # DeepSeek's 1,283. Allowing only the added tokens present in the text keeps that negligible.
        self._present = self._added.findall if self._added is not None else None
        self._plain_only = not matcher.ids  # no added tokens at all
        self._nfc_unsafe = nfc_unsafe
        self._native = native
        self.native_reason: str | None = None  # why tiktoken encodes instead of the native encoder

    @property
    def name(self) -> str:
        """Which engine encodes the text between added tokens: "native" or "tiktoken"."""
        return "native" if self._native is not None else "tiktoken"

    def _thread_encoding(self) -> tiktoken.Encoding:
        own: tiktoken.Encoding | None = getattr(self._local, "encoding", None)
        if own is None:
            shared = self._encoding
            # The same arguments as the verified encoding: the copy encodes identically.
            own = tiktoken.Encoding(
                shared.name,
                pat_str=shared._pat_str,
                mergeable_ranks=shared._mergeable_ranks,
                special_tokens=shared._special_tokens,
            )
            self._local.encoding = own
        return own

    def warm_this_thread(self) -> None:
        """Make this thread's own encoding now (~0.1 s) rather than in its first request. The native
        encoder needs none: it is shared by every thread and keeps no per-thread state."""
        if self._native is None:
            self._thread_encoding()

    def encode(self, text: str) -> list[int]:
        """Ids of ``text``; added-token text becomes the added tokens' ids."""
        if self._native is not None:
            out = array("i")
            self._native_into(text, out, self._native)
            return out.tolist()
        encoding = self._thread_encoding()
        route = self._route(text)
        if isinstance(route, set):
            if route:
                return encoding.encode(text, allowed_special=route, disallowed_special=())
            return encoding.encode_ordinary(text)
        return self._encode_routed(text, encoding, route)

    def encode_into(self, text: str, out: array[int]) -> None:
        """Append the ids of ``text`` to ``out`` (4-byte items), as `encode` returns them.

        tiktoken hands the ids over as a buffer of 32-bit ints, copied into ``out`` in one go: a list would
        first make a Python int of each id and the array then read each back (~3 M instructions per 7,800
        ids, a fifth of the encode itself), both while holding the GIL. The native encoder does the same."""
        if self._native is not None:
            self._native_into(text, out, self._native)
            return
        encoding = self._thread_encoding()
        route = self._route(text)
        if isinstance(route, set):
            # An empty allowed set encodes as encode_ordinary does (added-token text as plain text).
            ids = encoding._core_bpe.encode_to_tiktoken_buffer(text, route)  # format "I": cast to bytes
            out.frombytes(memoryview(ids).cast("B"))
        else:
            out.fromlist(self._encode_routed(text, encoding, route))

    def _native_into(self, text: str, out: array[int], native: _bytebpe.Encoder) -> None:
        """`encode_into` through the native encoder. In one call when it can: it matches the added tokens
        itself (when one scan finds them where Hugging Face does) and declines a text that may not be in NFC
        (when the tokenizer normalizes); otherwise added tokens are found here and the text between them
        is encoded piece by piece."""
        if self._added is not None or self._plain_only:
            try:
                ids = native.encode(text)
            except UnicodeEncodeError:  # a lone surrogate: `_slow_route` sends it to Hugging Face, which rejects it
                ids = None
            if ids is not None:
                out.frombytes(ids)
                return
        route = self._slow_route(text)
        if route is _Route.FALLBACK:
            out.fromlist(self._fallback(text))
        else:
            self._pieces_into(text, out, normalize=route is _Route.PIECES_NFC)

    def _slow_route(self, text: str) -> _Route | None:
        """The slower way a text must take whatever its added tokens (a lone surrogate: Hugging Face; with
        NFC, an unsafe character: Hugging Face, or a text not in NFC: normalized piece by piece), or None."""
        if not text.isascii():  # ASCII is NFC and holds no surrogate
            if _SURROGATE.search(text):
                # tiktoken silently replaces lone surrogates; Hugging Face rejects them. Keep its behavior.
                return _Route.FALLBACK
            if self._nfc_unsafe is not None:
                if self._nfc_unsafe.search(text):
                    return _Route.FALLBACK
                if not nfc.is_normalized(text):
                    return _Route.PIECES_NFC
        return None

    def _route(self, text: str) -> set[str] | _Route:
        """The added tokens tiktoken matches in ``text`` itself in one call (an empty set: none), or the
        slower way the text takes."""
        slow = self._slow_route(text)
        if slow is not None:
            return slow
        if self._plain_only:
            return _NONE_ALLOWED
        if self._present is not None:
            return set(self._present(text))
        return _Route.PIECES

    def _encode_routed(self, text: str, encoding: tiktoken.Encoding, route: _Route) -> list[int]:
        if route is _Route.FALLBACK:
            return self._fallback(text)
        out = array("i")
        self._pieces_into(text, out, normalize=route is _Route.PIECES_NFC, encoding=encoding)
        return out.tolist()

    def _pieces_into(
        self, text: str, out: array[int], *, normalize: bool, encoding: tiktoken.Encoding | None = None
    ) -> None:
        """Added tokens found by the matcher, the text between them encoded (NFC-normalized first when
        ``normalize``: Hugging Face normalizes each piece between added tokens, never across one)."""
        start = 0
        for begin, end in [*self._matcher.spans(text), (len(text), len(text))]:
            if start < begin:
                piece = text[start:begin]
                self._plain_into(nfc.normalize(piece) if normalize else piece, out, encoding)
            if begin < end:
                out.append(self._matcher.ids[text[begin:end]])
            start = end

    def _plain_into(self, text: str, out: array[int], encoding: tiktoken.Encoding | None) -> None:
        """Append the ids of ``text`` taken as plain text (added-token text included)."""
        if self._native is not None:
            ids = self._native.encode(text, True)  # plain: never None
            assert ids is not None
            out.frombytes(ids)
        else:
            tiktoken_encoding = encoding if encoding is not None else self._thread_encoding()
            ids = tiktoken_encoding._core_bpe.encode_to_tiktoken_buffer(text, _NONE_ALLOWED)
            out.frombytes(memoryview(ids).cast("B"))


def plan(definition: Mapping[str, Any], added: Sequence[AddedToken]) -> tiktoken.Encoding | str:
    """A tiktoken encoding equivalent to ``definition`` by structure, or why none is."""
    model = definition.get("model") or {}
    if model.get("type") != "BPE":
        return f"model is {model.get('type')!r}, not BPE"
    if model.get("dropout") or model.get("continuing_subword_prefix") or model.get("end_of_word_suffix"):
        return "BPE uses dropout or subword prefixes/suffixes"
    normalizer = definition.get("normalizer")
    if normalizer is not None and not _is_empty_sequence(normalizer, "normalizers"):
        if not nfc.is_nfc_only(normalizer):
            return f"normalizer {normalizer.get('type')!r} may change the text"
        if any(t.normalized for t in added):
            return "an added token is matched after NFC (normalized=True)"
    decoder = definition.get("decoder") or {}
    if decoder.get("type") != "ByteLevel":
        return "decoder is not ByteLevel"
    patterns = _split_patterns(definition.get("pre_tokenizer"))
    if isinstance(patterns, str):
        return patterns
    try:
        pattern = compose(patterns)
    except UnsupportedPattern as exc:
        return f"pre-tokenizer regex not expressible for tiktoken: {exc}"
    reason = matching_problem(added)
    if reason is not None:
        return reason
    added_contents = {t.content for t in added}
    ranks = _mergeable_ranks(model.get("vocab") or {}, added_contents)
    if isinstance(ranks, str):
        return ranks
    reason = _merge_order_problem(model.get("merges") or [], model.get("vocab") or {})
    if reason is not None:
        return reason
    specials = {t.content: t.id for t in added}
    try:
        return tiktoken.Encoding("hf-bytelevel-bpe", pat_str=pattern, mergeable_ranks=ranks, special_tokens=specials)
    except ValueError as exc:  # the regex engine rejected the composed pattern
        return f"tiktoken rejected the tokenizer: {exc}"


def build(
    definition: Mapping[str, Any],
    matcher: AddedTokenMatcher,
    reference: Callable[[str], list[int]],
    probes: Sequence[str],
    *,
    native: bool = True,
) -> FastBpeEncoder | str:
    """A verified fast encoder for the tokenizer ``definition`` describes, or why there is none.

    ``matcher`` finds the tokenizer's added tokens (with an identity normalizer it must run both
    passes; with NFC, `plan` requires every added token to be matched on the raw text). ``reference``
    is the Hugging Face encoder without special tokens added; the fast encoder is returned only if it
    gives the same ids on every probe text (and, with NFC, on texts NFC changes). ``native``: try the
    native encoder (`bpe_native`) before tiktoken; `FastBpeEncoder.native_reason` says why it is not used.
    """
    encoding = plan(definition, matcher.tokens)
    if isinstance(encoding, str):
        return encoding
    single_pass = single_pass_problem(matcher.tokens) is None
    normalizer = definition.get("normalizer")
    nfc_unsafe = nfc.unsafe_characters() if normalizer is not None and nfc.is_nfc_only(normalizer) else None
    texts = [*probes, *(_nfc_probes(matcher.tokens) if nfc_unsafe is not None else ())]
    native_reason: str | None = "not requested"
    if native:
        patterns = _split_patterns(definition.get("pre_tokenizer"))
        built = bpe_native.build(
            patterns if isinstance(patterns, list) else [],
            encoding._mergeable_ranks,
            added=matcher.ids if single_pass else None,
            normalizes=nfc_unsafe is not None,
        )
        if isinstance(built, str):
            native_reason = built
        else:
            encoder = FastBpeEncoder(
                encoding, matcher, reference, single_pass=single_pass, nfc_unsafe=nfc_unsafe, native=built
            )
            problem = _verify(encoder, reference, texts)
            if problem is None:
                return encoder
            native_reason = problem  # tiktoken may still pass
    encoder = FastBpeEncoder(encoding, matcher, reference, single_pass=single_pass, nfc_unsafe=nfc_unsafe)
    encoder.native_reason = native_reason
    # The verified encoding is the loading thread's own: its pools are this thread's (module docstring).
    encoder._local.encoding = encoding
    problem = _verify(encoder, reference, texts)
    return encoder if problem is None else problem


def _verify(encoder: FastBpeEncoder, reference: Callable[[str], list[int]], texts: Sequence[str]) -> str | None:
    """None if ``encoder`` gives Hugging Face's ids on every text, by both of its paths; else the first text."""
    for text in texts:
        expected = reference(text)
        into = array("i")
        encoder.encode_into(text, into)
        if encoder.encode(text) != expected or into.tolist() != expected:
            return f"ids differ from Hugging Face on probe text {text[:40]!r}"
    return None


def _nfc_probes(added: Sequence[AddedToken]) -> list[str]:
    """Texts NFC changes: compositions, reordered marks, Hangul jamo, exclusions, a mark after an added
    token that would compose with its last character if normalized across it."""
    texts = [
        "e\u0301t\u00e9",
        "A\u030a \u212b",
        "a\u0308\u0301 q\u0323\u0307",
        "\u1100\u1161\u11a8",
        "\u0958 \U0001d15e",
    ]
    texts += [f"x{t.content}\u0338 {t.content[:-1]}\u0338" for t in added[:8]]
    return texts


def _is_empty_sequence(node: Mapping[str, Any], key: str) -> bool:
    return node.get("type") == "Sequence" and all(_is_empty_sequence(c, key) for c in node.get(key) or ())


def _split_patterns(pre: Mapping[str, Any] | None) -> list[str] | str:
    """The Split regexes a byte-level pre-tokenizer applies, in order, or why it is not one."""
    if pre is None:
        return "no pre-tokenizer"
    steps = list(pre.get("pretokenizers") or ()) if pre.get("type") == "Sequence" else [pre]
    if not steps or steps[-1].get("type") != "ByteLevel":
        return "pre-tokenizer does not end with ByteLevel"
    patterns: list[str] = []
    for step in steps[:-1]:
        if step.get("type") != "Split":
            return f"pre-tokenizer step {step.get('type')!r} is not a Split"
        regex = (step.get("pattern") or {}).get("Regex")
        if regex is None or step.get("behavior") != "Isolated" or step.get("invert"):
            return "a Split is not an isolating regex split"
        patterns.append(regex)
    byte_level = steps[-1]
    if byte_level.get("add_prefix_space"):
        return "ByteLevel adds a prefix space"
    if byte_level.get("use_regex", True):
        patterns.append(GPT2_PATTERN)
    if not patterns:
        return "no split regex"
    return patterns


def _mergeable_ranks(vocab: Mapping[str, int], added: set[str]) -> dict[bytes, int] | str:
    decode = str.maketrans(_gpt2_unicode_to_byte())
    ranks: dict[bytes, int] = {}
    for token, rank in vocab.items():
        try:
            ranks[token.translate(decode).encode("latin-1")] = rank
        except UnicodeEncodeError:
            if token in added:  # e.g. DeepSeek's BOS: split out before BPE, so never merged
                continue
            return f"vocabulary entry {token!r} is not byte-level"
    if len(ranks) != len(vocab) - len(added & vocab.keys()):
        return "two vocabulary entries decode to the same bytes"
    if any(bytes([b]) not in ranks for b in range(256)):
        return "the vocabulary lacks some of the 256 single bytes"
    return ranks


def _merge_order_problem(merges: Sequence[Any], vocab: Mapping[str, int]) -> str | None:
    """None if merge priority equals merged-token rank: merged tokens' ids never decrease along the list."""
    if not merges:
        return "no merges"
    # Merges are "left right" strings (byte-level tokens contain no spaces) or [left, right] pairs.
    joined = map(methodcaller("replace", " ", ""), merges) if isinstance(merges[0], str) else map("".join, merges)
    try:
        ids = list(map(vocab.__getitem__, joined))
    except KeyError as exc:
        return f"merge result {exc.args[0]!r} is not in the vocabulary"
    if not all(map(le, ids, islice(ids, 1, None))):
        return "merge priority differs from token rank"
    return None
