"""Simulated log probabilities: deterministic, plausible, and shaped like vLLM's.

The simulated engine does not compute a distribution; it invents one per position that is stable for a given
token id and position, so gateways can be tested end to end (the sampled token's logprob, and `top_n`
alternatives in descending order, the sampled token first).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

_GOLDEN = 2654435761  # Knuth's multiplicative hash constant: spreads ids over the 32-bit range


@dataclass(frozen=True, slots=True)
class TokenLogprobs:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    top_ids: tuple[tuple[int, ...], ...]
    top_logprobs: tuple[tuple[float, ...], ...]


def _mix(token_id: int, position: int) -> int:
    return ((token_id + 1) * _GOLDEN + position * 40503) & 0xFFFFFFFF


def simulate(token_ids: Sequence[int], *, start: int, top_n: int, vocab_size: int) -> TokenLogprobs:
    """Logprobs for ``token_ids`` generated at positions ``start, start+1, ...`` (all values < 0)."""
    values: list[float] = []
    tops: list[tuple[int, ...]] = []
    top_values: list[tuple[float, ...]] = []
    for k, token in enumerate(token_ids):
        h = _mix(token, start + k)
        value = -0.01 - (h % 2000) / 1000.0  # in (-2.01, -0.01]
        values.append(value)
        ids = [token]
        lps = [value]
        for j in range(1, top_n):
            ids.append((token + j * 7919 + h) % vocab_size)
            lps.append(value - j * 0.5 - ((h >> j) % 100) / 1000.0)
        tops.append(tuple(ids[:top_n]))
        top_values.append(tuple(lps[:top_n]))
    return TokenLogprobs(tuple(token_ids), tuple(values), tuple(tops), tuple(top_values))
