"""The gateway's tokenizer: a typed face over Hugging Face ``tokenizers`` loaded from tokenizer.json, with
a faster exact encoder and a cache behind the same `Tokenizer.encode`.

`Tokenizer.encode` is the single choke point for text -> ids. Whatever runs behind it returns exactly the
ids Hugging Face returns; each shortcut is established when the tokenizer loads and skipped otherwise:

- a tiktoken encoder (`bpe_fast`) for byte-level BPE vocabularies whose merge priority equals token rank,
  verified structurally and on a probe corpus (`probe_corpus`);
- the post-processor reduced to constant ids around the text (`encode_rules.post_processor_affixes`);
- a two-level cache (`token_cache`): exact texts, and prefixes cut after added tokens where
  `encode_rules.segmentation_hazard` finds cutting exact.
`Tokenizer.encode_path` says which were taken and why not.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import json
from array import array
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import tokenizers

from node.config import TokenizerCacheConfig
from node.pipeline import bpe_fast
from node.pipeline.encode_rules import (
    normalizer_is_identity,
    post_processor_affixes,
    read_added_tokens,
    segmentation_hazard,
)
from node.pipeline.model import ModelFolderError
from node.pipeline.probe_corpus import probe_texts
from node.pipeline.special_tokens import AddedTokenMatcher
from node.pipeline.token_cache import (
    ID_TYPECODE,
    CachedEncoder,
    EncodeJob,
    SegmentRules,
    TokenCache,
    TokenCacheStats,
)

if TYPE_CHECKING:
    from node.models.parses import TokenizerParses

TOKENIZER_FILE = "tokenizer.json"
# encode_batch_fast skips offset tracking (~2x faster) and releases the GIL; older releases lack it.
_HAS_FAST_BATCH = hasattr(tokenizers.Tokenizer, "encode_batch_fast")
_DEFAULT_CACHE = TokenizerCacheConfig()
# A post-processor that adds ids around the text shows it on any text; a few probes suffice.
_AFFIX_PROBES = 12
# The hazard check encodes each piece of a probe separately; texts with more cuts add time, not coverage.
_MAX_PROBE_CUTS = 64


@dataclass(frozen=True, slots=True)
class EncodePath:
    """How `Tokenizer.encode` runs for one tokenizer, decided at load (log it at startup)."""

    encoder: str  # "native" (bpe_native), "tiktoken" or "huggingface", fastest first
    encoder_reason: str | None  # why not a faster one; None for "native" (or when none was requested)
    prefix_cache: bool  # L1 active
    prefix_cache_reason: str | None  # why L1 cannot be exact for this tokenizer (None: it can)


class Tokenizer:
    """Encodes and decodes with one vocabulary. Immutable after construction apart from its cache, and
    safe to share across threads (the Rust tokenizer and tiktoken take ``&self``; the cache locks)."""

    __slots__ = (
        "_affixes",
        "_cache",
        "_cached",
        "_encoder_reason",
        "_fast",
        "_raw",
        "_rules",
        "_segment_hazard",
        "encode_path",
        "fingerprint",
        "special_token_ids",
        "vocab_size",
    )

    def __init__(
        self,
        raw: tokenizers.Tokenizer,
        *,
        fingerprint: str,
        definition: Mapping[str, Any] | None = None,
        cache: TokenizerCacheConfig | TokenCache | None = _DEFAULT_CACHE,
        fast: bool = True,
        native: bool = True,
    ) -> None:
        """``definition`` is the parsed tokenizer.json (re-read from ``raw`` if omitted). ``cache`` is a
        config (a private cache) or a `TokenCache` shared with other tokenizers; None disables caching.
        ``fast=False`` keeps Hugging Face as the encoder; ``native=False`` keeps tiktoken (not the native
        encoder) as the fast one."""
        self._raw = raw
        # Identifies the vocabulary and its rules: two tokenizers with the same fingerprint produce the
        # same ids, so token-level caches and KV-aware routing may key on it.
        self.fingerprint = fingerprint
        self.vocab_size: int = raw.get_vocab_size(with_added_tokens=True)
        self.special_token_ids: frozenset[int] = frozenset(
            token_id for token_id, token in raw.get_added_tokens_decoder().items() if token.special
        )
        spec = definition if definition is not None else json.loads(raw.to_str())
        added = read_added_tokens(raw)
        probes = probe_texts(t.content for t in added)
        self._affixes = post_processor_affixes(spec, self._hf_encode, probes[:_AFFIX_PROBES])

        # Without a normalizer that changes text, both of Hugging Face's added-token passes see raw text.
        matcher = AddedTokenMatcher(added, second_pass=normalizer_is_identity(spec))
        self._fast: bpe_fast.FastBpeEncoder | None = None
        encoder_reason: str | None = None
        if fast:
            built = self._build_fast(spec, matcher, probes, native=native)
            if isinstance(built, str):
                encoder_reason = built
            else:
                self._fast = built
                encoder_reason = built.native_reason

        # Decided once, whatever the cache: `with_cache` can then attach one without re-analysing.
        self._segment_hazard = segmentation_hazard(
            spec,
            raw,
            matcher=matcher,
            affixes=self._affixes,
            encode=self._hf_encode,
            probes=[p for p in probes if len(matcher.boundaries(p)) <= _MAX_PROBE_CUTS],
        )
        self._rules: SegmentRules | None = None
        if self._segment_hazard is None and self._affixes is not None:
            plain = self._fast.encode_into if self._fast is not None else self._hf_encode_plain_into
            self._rules = SegmentRules(matcher.boundaries, plain, self._affixes)
        self._encoder_reason = encoder_reason
        self._attach(cache)

    def _attach(self, cache: TokenizerCacheConfig | TokenCache | None) -> None:
        self._cache = TokenCache(cache) if isinstance(cache, TokenizerCacheConfig) else cache
        self._cached = (
            CachedEncoder(self._cache, fingerprint=self.fingerprint, encode=self._encode_array, rules=self._rules)
            if self._cache is not None
            else None
        )
        self.encode_path = EncodePath(
            encoder=self._fast.name if self._fast is not None else "huggingface",
            encoder_reason=self._encoder_reason,
            prefix_cache=self._cached is not None and self._cached.prefix_cache_active,
            prefix_cache_reason=self._segment_hazard,
        )

    def warm_this_thread(self) -> None:
        """Ready this thread to encode: the fast encoder's own copy for it (~0.1 s once; `bpe_fast`). Call it
        on a thread that encodes requests, before it serves them."""
        if self._fast is not None:
            self._fast.warm_this_thread()

    def with_cache(self, cache: TokenizerCacheConfig | TokenCache | None) -> Tokenizer:
        """The same tokenizer (sharing its encoders; no re-analysis) behind another cache, e.g. one
        `TokenCache` shared by every served model, or none."""
        clone = copy.copy(self)
        clone._attach(cache)
        return clone

    def _build_fast(
        self, spec: Mapping[str, Any], matcher: AddedTokenMatcher, probes: Sequence[str], *, native: bool
    ) -> bpe_fast.FastBpeEncoder | str:
        if self._affixes is None:
            return "the post-processor does more than add ids around the text"
        if self._raw.truncation is not None or self._raw.padding is not None:
            return "truncation or padding is configured"
        return bpe_fast.build(spec, matcher, self._hf_encode_plain, probes, native=native)

    @classmethod
    def from_bytes(
        cls,
        data: bytes,
        *,
        cache: TokenizerCacheConfig | TokenCache | None = _DEFAULT_CACHE,
        fast: bool = True,
        native: bool = True,
        parses: TokenizerParses | None = None,
    ) -> Tokenizer:
        """Build from the contents of a tokenizer.json. ``parses``: parses shared with other loaders in this
        process (the demo's simulated workers load the same file).

        Raises:
            ValueError: ``data`` is not a tokenizer definition the ``tokenizers`` library accepts.
        """
        fingerprint = hashlib.sha256(data).hexdigest()
        try:
            raw = tokenizers.Tokenizer.from_buffer(data) if parses is None else parses.parse(data, fingerprint)
        except Exception as exc:  # the binding raises a bare Exception for every parse failure
            raise ValueError(f"not a valid tokenizer definition: {exc}") from exc
        definition = json.loads(data)  # valid JSON: the binding just parsed it
        return cls(raw, fingerprint=fingerprint, definition=definition, cache=cache, fast=fast, native=native)

    @classmethod
    def from_file(
        cls,
        path: Path,
        *,
        cache: TokenizerCacheConfig | TokenCache | None = _DEFAULT_CACHE,
        fast: bool = True,
        native: bool = True,
        parses: TokenizerParses | None = None,
    ) -> Tokenizer:
        """Load a tokenizer.json file, or the one inside a model folder if ``path`` is a directory (``parses``:
        as `from_bytes`).

        Raises:
            ModelFolderError: the file is missing, unreadable or not a valid tokenizer (names the file).
        """
        file = path / TOKENIZER_FILE if path.is_dir() else path
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise ModelFolderError(file, f"cannot read: {exc.strerror or exc}") from exc
        try:
            return cls.from_bytes(data, cache=cache, fast=fast, native=native, parses=parses)
        except ValueError as exc:
            raise ModelFolderError(file, str(exc)) from exc

    @property
    def raw(self) -> tokenizers.Tokenizer:
        """The underlying Hugging Face tokenizer, e.g. for ``tokenizers.decoders.DecodeStream``."""
        return self._raw

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Ids for ``text``, identical to Hugging Face's. ``add_special_tokens`` applies the tokenizer's
        post-processor (e.g. a leading BOS); pass False for text rendered by a chat template, which
        already contains its special tokens. Added-token text inside ``text`` always becomes their ids.

        Raises:
            TypeError: ``text`` is not encodable (Hugging Face rejects lone surrogates).
        """
        if self._cached is not None:
            return self._cached.encode(text, add_special_tokens)
        return self._encode(text, add_special_tokens)

    def prepare(self, text: str, *, add_special_tokens: bool) -> EncodeJob:
        """`encode` in two steps: the cache lookup now (cheap), the encoding left in the returned job, whose
        ``pending_chars`` tells whether it is worth a thread. ``prepare(...).finish() == encode(...)``."""
        if self._cached is not None:
            return self._cached.prepare(text, add_special_tokens)
        return EncodeJob(len(text), functools.partial(self._encode_array, text, add_special_tokens))

    def encode_ids(self, text: str, *, add_special_tokens: bool) -> array[int]:
        """`encode`'s ids as an array of 32-bit ints (the caller's own): what a request carries to its
        worker, without a Python int per id."""
        return self.prepare(text, add_special_tokens=add_special_tokens).ids()

    def encode_uncached(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """`encode` bypassing the cache (same ids; for benchmarks and checks)."""
        return self._encode(text, add_special_tokens)

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool) -> list[list[int]]:
        """``[encode(t) for t in texts]``: through the fast encoder and cache when present, else in
        parallel by Hugging Face (same ids, by contract)."""
        if self._fast is not None or self._cached is not None:
            return [self.encode(t, add_special_tokens=add_special_tokens) for t in texts]
        return self._hf_encode_batch(list(texts), add_special_tokens)

    def cache_stats(self) -> TokenCacheStats | None:
        """Hit/miss/size counters of the cache behind this tokenizer (shared caches count all users)."""
        return self._cache.stats() if self._cache is not None else None

    def clear_cache(self) -> None:
        """Drop every cached entry (of all tokenizers sharing the cache); counters keep counting."""
        if self._cache is not None:
            self._cache.clear()

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        """Text for ``ids``; ``skip_special_tokens`` drops the ids in `special_token_ids`."""
        return self._raw.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """The id of one token string (e.g. ``"<|eot_id|>"``), or None if it is not in the vocabulary."""
        return self._raw.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The token string of one id, or None if the id is out of range."""
        return self._raw.id_to_token(token_id)

    # --- encoders behind the cache ---

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if self._fast is None:
            return self._hf_encode(text, add_special_tokens)
        ids = self._fast.encode(text)
        if add_special_tokens:
            assert self._affixes is not None  # the fast path requires known affixes
            return self._affixes.wrap(ids)
        return ids

    def _encode_array(self, text: str, add_special_tokens: bool) -> array[int]:
        """`_encode` as an array of 32-bit ids (what the cache keeps), without a list in between."""
        out = array(ID_TYPECODE)
        if self._fast is None:
            out.fromlist(self._hf_encode(text, add_special_tokens))
            return out
        affixes = self._affixes if add_special_tokens else None
        if affixes is not None:
            out.extend(affixes.prefix)
        self._fast.encode_into(text, out)
        if affixes is not None:
            out.extend(affixes.suffix)
        return out

    def _hf_encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self._hf_encode_batch([text], add_special_tokens)[0]

    def _hf_encode_plain(self, text: str) -> list[int]:
        return self._hf_encode_batch([text], False)[0]

    def _hf_encode_plain_into(self, text: str, out: array[int]) -> None:
        out.fromlist(self._hf_encode_plain(text))

    def _hf_encode_batch(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        if _HAS_FAST_BATCH:
            encodings = self._raw.encode_batch_fast(texts, add_special_tokens=add_special_tokens)
        else:
            encodings = self._raw.encode_batch(texts, add_special_tokens=add_special_tokens)
        return [encoding.ids for encoding in encodings]
