"""Rate and concurrency limits: the admission arithmetic and OpenAI's x-ratelimit-* headers (a pure core: the
counts and the time come in).

Windows are fixed minutes (``WINDOW_S``), counted cluster-wide by the mesh's counters (node/cluster/limiter.py):
a burst at a window boundary can admit up to twice a limit within one rolling minute, the usual price of fixed
windows, and what lets every node agree on a window without coordination.

*Share.* A node enforces ``limit x share`` against the cluster-wide count, where ``share`` is the part of the
cluster whose counts it can see: 1 when every member it has recently known is alive and synced, ``1/N`` when it
is cut off from N-1 others. So a partition never admits more than the limit in total (fail-safe: each side
enforces its share on what it knows), and a node that has not yet synced with its peers does not admit a full
limit on its own count.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Final, Literal

from node.auth.identity import Limits

#: The rate limits' window: requests and tokens per minute.
WINDOW_S: Final = 60.0

LimitKind = Literal["requests", "tokens", "concurrent", "capacity"]


def effective(limit: int, share: float) -> int:
    """The part of ``limit`` a node with ``share`` of the cluster in view may admit (at least 1, so a tiny
    limit still admits something somewhere; 0 stays 'no limit')."""
    if not limit:
        return 0
    return max(1, math.floor(limit * share))


def window_reset_s(now: float) -> float:
    return WINDOW_S - (now % WINDOW_S)


def format_duration(seconds: float) -> str:
    """OpenAI's reset format: ``6m0s``, ``1s``, ``250ms``."""
    if seconds < 1:
        return f"{max(1, round(seconds * 1000))}ms"
    whole = math.ceil(seconds)
    minutes, secs = divmod(whole, 60)
    return f"{minutes}m{secs}s" if minutes else f"{secs}s"


@dataclass(frozen=True, slots=True)
class Usage:
    """What one scope (a key or a tenant) has used, cluster-wide, as this node sees it."""

    requests: int = 0
    tokens: int = 0
    concurrent: int = 0


@dataclass(frozen=True, slots=True)
class Verdict:
    """Admit or refuse one request for one scope. ``refused``: the first exhausted limit, else None."""

    refused: LimitKind | None
    retry_after_s: float
    headers: Mapping[str, str] = field(default_factory=lambda: MappingProxyType({}))


def judge(limits: Limits, used: Usage, *, share: float, now: float, reserve_tokens: int = 0) -> Verdict:
    """Whether one more request (reserving ``reserve_tokens``) fits ``limits`` given ``used``; with the
    x-ratelimit-* headers the response should carry (remaining counts include this request if admitted)."""
    reset = window_reset_s(now)
    rpm = effective(limits.requests_per_minute, share)
    tpm = effective(limits.tokens_per_minute, share)
    conc = effective(limits.concurrent, share)
    refused: LimitKind | None = None
    retry = 0.0
    if rpm and used.requests + 1 > rpm:
        refused, retry = "requests", reset
    elif tpm and used.tokens + max(reserve_tokens, 1) > tpm:
        refused, retry = "tokens", reset
    elif conc and used.concurrent + 1 > conc:
        refused, retry = "concurrent", 1.0
    admitted = refused is None
    headers: dict[str, str] = {}
    if limits.requests_per_minute:
        remaining = rpm - used.requests - (1 if admitted else 0)
        headers["x-ratelimit-limit-requests"] = str(limits.requests_per_minute)
        headers["x-ratelimit-remaining-requests"] = str(max(0, remaining))
        headers["x-ratelimit-reset-requests"] = format_duration(reset)
    if limits.tokens_per_minute:
        remaining = tpm - used.tokens - (reserve_tokens if admitted else 0)
        headers["x-ratelimit-limit-tokens"] = str(limits.tokens_per_minute)
        headers["x-ratelimit-remaining-tokens"] = str(max(0, remaining))
        headers["x-ratelimit-reset-tokens"] = format_duration(reset)
    if refused is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry)))
    return Verdict(refused, retry, MappingProxyType(headers))
