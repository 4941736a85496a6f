"""A two-level cache in front of a tokenizer's encoder. Thread-safe: encode runs on a thread pool.

L0, exact match: ``(fingerprint, add_special_tokens, text) -> ids``. Repeated prompts (retries, the same
completion prompt from many clients) cost one dictionary lookup. Texts L1 serves are not stored in L0.

L1, prefix at added-token boundaries: ``digest(fingerprint, text[:cut]) -> ids of text[:cut]`` for cuts
right after an added token (`special_tokens.AddedTokenMatcher`): each text's last cut and, before it, one
cut every ``l1_spacing_chars``. A new text is encoded from its longest cached prefix: only the suffix is
tokenized, without special tokens (the post-processor's BOS/EOS go around the whole text,
`encode_rules.Affixes`). In multi-turn chat, turn k+1's prompt extends turn k's up to turn k's last added
token (Llama-3: the assistant header's ``<|end_header_id|>``; DeepSeek: ``<｜Assistant｜>``), so a long
shared system prompt and the earlier turns are tokenized once.

Exactness rests on `encode_rules.segmentation_hazard` having found no hazard for the tokenizer: ids of
``text`` == ids of ``text[:cut]`` + ids of ``text[cut:]`` for every such cut. Prefix digests are BLAKE2b-128
of the exact prefix (a collision is as unlikely as a forged hash), chained so a text is hashed once.

Each level is an LRU bounded in bytes: ids count 4 bytes (stored as ``array('i')``), L0 also counts its
key text, every entry a fixed overhead. L1 entries of one conversation share one growing id array.
"""

from __future__ import annotations

import functools
import hashlib
import sys
import threading
from array import array
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from node.config import TokenizerCacheConfig
from node.pipeline.encode_rules import Affixes

ID_TYPECODE: Final = "i"  # 4 bytes per id: vocabularies stay far below 2**31
assert array(ID_TYPECODE).itemsize == 4, "encoders append 32-bit ids (`SegmentRules.encode_plain_into`)"
# Dictionary slot, key tuple/digest and bookkeeping per entry, rounded up.
_ENTRY_OVERHEAD_BYTES: Final = 200
_MIB: Final = 1024 * 1024
# A chat turn pair adds a handful of added tokens (Llama-3: 6; tool calls a few more), so the previous
# turn's last cut is among this many last cuts of the next turn's prompt.
_RECENT_CUTS: Final = 16


@dataclass(frozen=True, slots=True)
class LevelStats:
    hits: int
    misses: int
    evictions: int
    entries: int
    bytes: int


@dataclass(frozen=True, slots=True)
class TokenCacheStats:
    """A snapshot of both levels. L1 counts only lookups of texts containing an added token."""

    l0: LevelStats
    l1: LevelStats


@dataclass(frozen=True, slots=True)
class SegmentRules:
    """How one tokenizer's texts are encoded piece by piece (L1): where they may be cut, how a piece is
    encoded, and the ids ``add_special_tokens`` puts around a whole text."""

    boundaries: Callable[[str], list[int]]  # `AddedTokenMatcher.boundaries`
    encode_plain_into: Callable[[str, array[int]], None]  # appends the ids, no special tokens added
    affixes: Affixes


class _Counters:
    __slots__ = ("bytes", "evictions", "hits", "misses")

    def __init__(self) -> None:
        self.hits = self.misses = self.evictions = self.bytes = 0


class _Run:
    """Ids of one prefix chain; entries reference a leading slice of it. ``refs`` counts those entries:
    the array's bytes are accounted while at least one entry references it."""

    __slots__ = ("ids", "refs")

    def __init__(self, ids: array[int]) -> None:
        self.ids = ids
        self.refs = 0

    @property
    def nbytes(self) -> int:
        return len(self.ids) * self.ids.itemsize


class TokenCache:
    """The shared storage of both levels. Keys carry the tokenizer fingerprint, so tokenizers with
    different vocabularies may share one instance (one memory budget for the node)."""

    def __init__(self, config: TokenizerCacheConfig) -> None:
        self.config = config
        self._lock = threading.Lock()
        self._l0: OrderedDict[tuple[str, bool, str], array[int]] = OrderedDict()
        self._l1: OrderedDict[bytes, tuple[_Run, int]] = OrderedDict()
        self._c0 = _Counters()
        self._c1 = _Counters()

    def stats(self) -> TokenCacheStats:
        with self._lock:
            return TokenCacheStats(
                l0=LevelStats(self._c0.hits, self._c0.misses, self._c0.evictions, len(self._l0), self._c0.bytes),
                l1=LevelStats(self._c1.hits, self._c1.misses, self._c1.evictions, len(self._l1), self._c1.bytes),
            )

    def clear(self) -> None:
        with self._lock:
            for run, _ in self._l1.values():
                run.refs = 0  # an encode in flight holding one must copy it, not grow it unaccounted
            self._l0.clear()
            self._l1.clear()
            self._c0.bytes = self._c1.bytes = 0

    # --- L0 ---

    def get_exact(self, key: tuple[str, bool, str]) -> array[int] | None:
        with self._lock:
            ids = self._l0.get(key)
            if ids is None:
                self._c0.misses += 1
                return None
            self._l0.move_to_end(key)
            self._c0.hits += 1
            return ids

    def put_exact(self, key: tuple[str, bool, str], ids: array[int]) -> None:
        """Cache a copy of ``ids`` (the caller keeps its own)."""
        size = _l0_size(key, ids)
        if size > self.config.l0_max_bytes:
            return
        stored = ids[:]
        with self._lock:
            old = self._l0.pop(key, None)
            if old is not None:
                self._c0.bytes -= _l0_size(key, old)
            self._l0[key] = stored
            self._c0.bytes += size
            while self._c0.bytes > self.config.l0_max_bytes:
                evicted_key, evicted = self._l0.popitem(last=False)
                self._c0.bytes -= _l0_size(evicted_key, evicted)
                self._c0.evictions += 1

    # --- L1 ---

    def longest_prefix(self, digests: list[bytes]) -> tuple[int, _Run, array[int]] | None:
        """The last index whose digest is cached, its run and a copy of its ids; counts a hit or miss."""
        with self._lock:
            for i in range(len(digests) - 1, -1, -1):
                entry = self._l1.get(digests[i])
                if entry is not None:
                    self._l1.move_to_end(digests[i])
                    self._c1.hits += 1
                    run, length = entry
                    return i, run, run.ids[:length]
            self._c1.misses += 1
            return None

    def put_prefixes(
        self, base: _Run | None, base_ids: array[int], new_ids: array[int], entries: list[tuple[bytes, int]]
    ) -> None:
        """Cache prefixes of ``base_ids + new_ids``: ``entries`` are (digest, id count) pairs.

        When ``base`` still ends where ``base_ids`` does (this text continues the conversation it came
        from, the usual case), the run grows in place; otherwise a new run holds a copy.
        """
        if not entries:
            return
        if len(base_ids) + len(new_ids) > self.config.l1_max_bytes // array(ID_TYPECODE).itemsize:
            return
        with self._lock:
            if base is not None and base.refs > 0 and len(base.ids) == len(base_ids):
                run = base
                run.ids.extend(new_ids)
                self._c1.bytes += len(new_ids) * run.ids.itemsize
            else:
                run = _Run(base_ids + new_ids)
            for digest, length in entries:
                old = self._l1.pop(digest, None)
                if old is not None:
                    self._release(old[0])
                    self._c1.bytes -= _ENTRY_OVERHEAD_BYTES
                if run.refs == 0:
                    self._c1.bytes += run.nbytes
                run.refs += 1
                self._l1[digest] = (run, length)
                self._c1.bytes += _ENTRY_OVERHEAD_BYTES
            while self._c1.bytes > self.config.l1_max_bytes and self._l1:
                _, (evicted, _) = self._l1.popitem(last=False)
                self._release(evicted)
                self._c1.bytes -= _ENTRY_OVERHEAD_BYTES
                self._c1.evictions += 1

    def _release(self, run: _Run) -> None:
        run.refs -= 1
        if run.refs == 0:
            self._c1.bytes -= run.nbytes


def _candidate_cuts(cuts: list[int], spacing: int) -> tuple[list[int], list[bool]]:
    """The cuts whose prefixes are looked up, and for each whether it gets an entry.

    Entries go at each cut at least ``spacing`` characters after the previous such cut (a choice made by
    the text before it, so texts sharing a prefix make the same choices in it) and at the last cut. The
    last `_RECENT_CUTS` cuts are looked up as well: the previous turn's last cut is among them, and a hit
    there re-encodes nothing already seen and lets the conversation's id array grow in place.
    """
    candidates: list[int] = []
    stored: list[bool] = []
    last = 0
    recent = len(cuts) - _RECENT_CUTS
    for i, cut in enumerate(cuts):
        keep = cut - last >= spacing or i == len(cuts) - 1
        if keep:
            last = cut
        if keep or i >= recent:
            candidates.append(cut)
            stored.append(keep)
    return candidates, stored


def _l0_size(key: tuple[str, bool, str], ids: array[int]) -> int:
    return sys.getsizeof(key[2]) + len(ids) * ids.itemsize + _ENTRY_OVERHEAD_BYTES


@dataclass(frozen=True, slots=True)
class EncodeJob:
    """What is left of one encode after the cache lookup: ``ids()`` returns the ids as an array of 32-bit
    ints (the caller's own), `finish()` as a list; call one of them once, from any thread. ``pending_chars``
    is how much text it still encodes: 0 for a cache hit."""

    pending_chars: int
    ids: Callable[[], array[int]]

    def finish(self) -> list[int]:
        return self.ids().tolist()

    @classmethod
    def done(cls, ids: array[int]) -> EncodeJob:
        return cls(0, lambda: ids)


@dataclass(frozen=True, slots=True)
class _PrefixPlan:
    """An L1 lookup's result: the candidate cuts and their digests, and the longest cached one."""

    text: str
    add_special_tokens: bool
    cuts: list[int]
    stored: list[bool]
    digests: list[bytes]
    hit: int  # index into cuts of the longest cached prefix, -1 for none
    base: _Run | None
    base_ids: array[int]


class CachedEncoder:
    """One tokenizer's encode behind a `TokenCache`. ``rules`` is None when cutting at added tokens is
    not exact for this tokenizer (L1 then stays off for it)."""

    __slots__ = ("_cache", "_encode", "_fingerprint", "_l0", "_l1", "_rules", "_seed")

    def __init__(
        self,
        cache: TokenCache,
        *,
        fingerprint: str,
        encode: Callable[[str, bool], array[int]],
        rules: SegmentRules | None,
    ) -> None:
        """``encode``: (text, add_special_tokens) -> ids, as an array of `ID_TYPECODE`."""
        self._cache = cache
        self._fingerprint = fingerprint
        self._encode = encode
        self._rules = rules
        self._l0 = cache.config.l0_enabled and cache.config.l0_max_bytes > 0
        self._l1 = cache.config.l1_enabled and cache.config.l1_max_bytes > 0 and rules is not None
        self._seed = hashlib.blake2b(fingerprint.encode(), digest_size=16)

    @property
    def prefix_cache_active(self) -> bool:
        return self._l1

    def encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.prepare(text, add_special_tokens).finish()

    def prepare(self, text: str, add_special_tokens: bool) -> EncodeJob:
        """Look ``text`` up in both levels (cheap: hashing, no encoding) and return what is left to do.

        The job's `EncodeJob.pending_chars` says how much text its `EncodeJob.finish` still encodes, so a
        caller can finish a cache hit inline and send only real work to a thread. Stats count here.
        """
        key = (self._fingerprint, add_special_tokens, text)
        if self._l0:
            hit = self._cache.get_exact(key)
            if hit is not None:
                return EncodeJob.done(hit[:])  # a copy: the entry stays as cached
        if self._l1 and len(text) >= self._cache.config.l1_min_prompt_chars:
            job = self._prefix_job(text, add_special_tokens)
            if job is not None:
                # Not copied into L0: L1 already holds these ids, and a repeat of the text is an L1 hit
                # on its last cut. Chat prompts are rarely repeated whole, so L0 would mostly churn.
                return job
        return EncodeJob(len(text), functools.partial(self._encode_whole, key))

    def _encode_whole(self, key: tuple[str, bool, str]) -> array[int]:
        ids = self._encode(key[2], key[1])
        if self._l0:
            self._cache.put_exact(key, ids)
        return ids

    def _prefix_job(self, text: str, add_special_tokens: bool) -> EncodeJob | None:
        rules = self._rules
        assert rules is not None  # guarded by self._l1
        cuts, stored = _candidate_cuts(rules.boundaries(text), self._cache.config.l1_spacing_chars)
        if not cuts:
            return None
        digests = self._digests(text, cuts)
        found = self._cache.longest_prefix(digests)
        if found is None:
            hit, base, base_ids = -1, None, array(ID_TYPECODE)
        else:
            hit, base, base_ids = found
        start = cuts[hit] if hit >= 0 else 0
        plan = _PrefixPlan(text, add_special_tokens, cuts, stored, digests, hit, base, base_ids)
        return EncodeJob(len(text) - start, functools.partial(self._finish_prefix, plan))

    def _finish_prefix(self, plan: _PrefixPlan) -> array[int]:
        rules = self._rules
        assert rules is not None
        text, cuts, stored, digests, base_ids = plan.text, plan.cuts, plan.stored, plan.digests, plan.base_ids
        start = cuts[plan.hit] if plan.hit >= 0 else 0
        # The new ids grow as one array, appended from the encoder's buffers, and the cache copies them from
        # it (lists per piece and an array made from them cost ~2 M instructions per 7,800 ids more, a sixth
        # of such a prompt's encode).
        new = array(ID_TYPECODE)
        entries: list[tuple[bytes, int]] = []
        for k in range(plan.hit + 1, len(cuts)):
            if not stored[k]:
                continue
            # Each piece is encoded on its own and never with special tokens: those go around the text.
            rules.encode_plain_into(text[start : cuts[k]], new)
            entries.append((digests[k], len(base_ids) + len(new)))
            start = cuts[k]
        if entries:
            self._cache.put_prefixes(plan.base, base_ids, new, entries)  # copies ``new``
        if start < len(text):
            rules.encode_plain_into(text[start:], new)
        ids = base_ids + new
        return rules.affixes.wrap_array(ids) if plan.add_special_tokens else ids

    def _digests(self, text: str, cuts: list[int]) -> list[bytes]:
        hasher = self._seed.copy()
        digests: list[bytes] = []
        start = 0
        for cut in cuts:
            # surrogatepass: a lone surrogate must hash, not raise; the encoder decides what it means.
            hasher.update(text[start:cut].encode("utf-8", "surrogatepass"))
            digests.append(hasher.copy().digest())
            start = cut
        return digests
