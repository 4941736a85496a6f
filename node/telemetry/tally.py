"""This process's running request totals for the status page: answered requests by status class and, per
worker, prompt and cached tokens (the prefix-cache hit ratio). The page turns totals into rates itself (the
difference between two refreshes), so nothing here keeps time windows."""

from __future__ import annotations

from dataclasses import dataclass, field

#: Workers with a token tally; past it new workers are not tallied (the status page shows their ratio as
#: unknown), so a registry churning through short-lived workers cannot grow this without bound.
MAX_TALLIED_WORKERS = 1024


@dataclass(slots=True)
class WorkerTokens:
    requests: int = 0
    prompt: int = 0
    cached: int = 0

    @property
    def cache_hit_ratio(self) -> float | None:
        return self.cached / self.prompt if self.prompt else None


@dataclass(slots=True)
class RequestTally:
    total: int = 0
    in_flight: int = 0
    by_class: dict[str, int] = field(default_factory=lambda: {"2xx": 0, "3xx": 0, "4xx": 0, "5xx": 0})
    generated: int = 0  # requests that reached a worker
    workers: dict[str, WorkerTokens] = field(default_factory=dict)

    def observe(self, status: int, worker: str, prompt: int, cached: int) -> None:
        self.total += 1
        key = f"{min(max(status // 100, 2), 5)}xx"
        self.by_class[key] += 1
        if not worker:
            return
        self.generated += 1
        tokens = self.workers.get(worker)
        if tokens is None:
            if len(self.workers) >= MAX_TALLIED_WORKERS:
                return
            tokens = self.workers[worker] = WorkerTokens()
        tokens.requests += 1
        tokens.prompt += prompt
        tokens.cached += cached
