"""Latency arithmetic of the simulated GPU: pure functions of token counts and batch size.

Time to first token = ``ttft_base_ms`` + ``ttft_per_uncached_token_ms`` x prompt tokens the prefix cache did
not serve. Time per output token = ``tpot_ms`` + ``tpot_per_running_ms`` x running sequences (the batch
term). A chunk of k tokens is ready when its last token is: the first chunk after the prefill and k-1 more
token times, every later chunk after k token times.
"""

from __future__ import annotations

from dataclasses import dataclass

from node.sim.config import SimWorkerConfig

_MS = 1e-3


@dataclass(frozen=True, slots=True)
class LatencyModel:
    ttft_base_ms: float = 0.0
    ttft_per_uncached_token_ms: float = 0.0
    tpot_ms: float = 0.0
    tpot_per_running_ms: float = 0.0

    @classmethod
    def from_config(cls, config: SimWorkerConfig) -> LatencyModel:
        return cls(
            ttft_base_ms=config.ttft_base_ms,
            ttft_per_uncached_token_ms=config.ttft_per_uncached_token_ms,
            tpot_ms=config.tpot_ms,
            tpot_per_running_ms=config.tpot_per_running_ms,
        )

    @property
    def is_zero(self) -> bool:
        return not (self.ttft_base_ms or self.ttft_per_uncached_token_ms or self.tpot_ms or self.tpot_per_running_ms)

    def prefill_s(self, uncached_tokens: int) -> float:
        """Seconds from admission to the first token."""
        return (self.ttft_base_ms + self.ttft_per_uncached_token_ms * max(0, uncached_tokens)) * _MS

    def token_s(self, running: int) -> float:
        """Seconds per output token while ``running`` sequences decode together."""
        return (self.tpot_ms + self.tpot_per_running_ms * max(0, running)) * _MS

    def chunk_s(self, *, first: bool, tokens: int, uncached_tokens: int, running: int) -> float:
        """Seconds from the previous chunk (admission, for the first) until a chunk of ``tokens`` is ready."""
        if first:
            return self.prefill_s(uncached_tokens) + max(0, tokens - 1) * self.token_s(running)
        return tokens * self.token_s(running)
