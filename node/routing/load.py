"""Load as policies compare it: the engine's report corrected by what this gateway sent since, or failing
that the gateway's own in-flight count.

An engine's report is stale the moment it is sampled; a policy that trusts it alone sends a whole burst of
arrivals to the worker that looked idlest at the last poll. ``DispatchCredit`` remembers what was sent to each
worker after its report was sampled, so each dispatch raises that worker's load at once (water-filling
instead of incast). Reports are compared on one basis only: when any candidate lacks a fresh report, every
candidate is compared on in-flight counts (a reported 50 queued requests and an unreported 2 in flight are
not comparable numbers).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable, Sequence
from itertools import islice

from node.routing.policy import Candidate, LoadView, load_of

# Dispatches remembered per worker between two load reports. At a 10 s poll this covers 400 requests/s to one
# worker; beyond it the oldest credit is forgotten (the report is then too stale to correct anyway).
MAX_CREDIT_ENTRIES = 4096


class DispatchCredit:
    """Requests and prompt tokens sent to each worker, by time, pruned as fresher reports arrive."""

    def __init__(self, max_entries: int = MAX_CREDIT_ENTRIES) -> None:
        self._max_entries = max_entries
        self._sent: dict[str, deque[tuple[float, int]]] = {}
        self._tokens: dict[str, int] = {}

    def record(self, url: str, now_s: float, tokens: int) -> None:
        sent = self._sent.get(url)
        if sent is None:
            sent = self._sent[url] = deque()
            self._tokens[url] = 0
        sent.append((now_s, tokens))
        self._tokens[url] += tokens
        if len(sent) > self._max_entries:
            _, old = sent.popleft()
            self._tokens[url] -= old

    def since(self, url: str, sampled_at: float) -> tuple[int, int]:
        """(requests, tokens) sent to ``url`` after ``sampled_at``; forgets what was sent before it."""
        sent = self._sent.get(url)
        if not sent:
            return 0, 0
        tokens = self._tokens[url]
        while sent and sent[0][0] <= sampled_at:
            tokens -= sent.popleft()[1]
        self._tokens[url] = tokens
        return len(sent), tokens

    def open_since(self, url: str, sampled_at: float, still_open: int) -> tuple[int, int]:
        """(requests, tokens) sent to ``url`` after ``sampled_at`` that are still open, given that
        ``still_open`` requests are open there in all: of what was sent since, only those add load (a request
        that finished is in no queue). The latest dispatches are taken as the open ones (earlier ones finish
        first). Forgets what was sent before ``sampled_at``."""
        requests, tokens = self.since(url, sampled_at)
        if requests <= still_open:
            return requests, tokens
        still_open = max(still_open, 0)
        return still_open, sum(t for _, t in islice(reversed(self._sent[url]), still_open))

    def retain(self, urls: Iterable[str]) -> None:
        keep = set(urls)
        for url in [u for u in self._sent if u not in keep]:
            del self._sent[url]
            del self._tokens[url]


def fresh_load(candidate: Candidate, now_s: float, stale_after_s: float) -> LoadView | None:
    view = load_of(candidate)
    if view is None or now_s - view.updated_at > stale_after_s:
        return None
    return view


def request_loads(
    candidates: Sequence[Candidate], credit: DispatchCredit, now_s: float, stale_after_s: float
) -> list[float]:
    """Each candidate's load in requests, all on one basis (see the module docstring)."""
    oldest = now_s - stale_after_s
    views: list[LoadView] = []
    for candidate in candidates:
        view = getattr(candidate, "load", None)
        if not isinstance(view, LoadView) or view.updated_at < oldest:
            return [float(c.in_flight) for c in candidates]
        views.append(view)
    # Of what was sent since a report, only what is still open adds load. Without this cap a report that stops
    # being refreshed (a worker whose KV-event stream replaced the polls but carries no load records) turns
    # into a running total of every dispatch since.
    return [
        float(v.running + v.waiting + credit.open_since(c.url, v.updated_at, c.in_flight)[0])
        for c, v in zip(candidates, views, strict=True)
    ]


def is_imbalanced(loads: Sequence[float], abs_threshold: float, rel_threshold: float) -> bool:
    """SMG's rule: both ``max - min > abs_threshold`` and ``max > rel_threshold * min``."""
    high, low = max(loads), min(loads)
    return high - low > abs_threshold and high > rel_threshold * low


def argmin(values: Sequence[float]) -> int:
    """The index of the smallest value; the first on ties."""
    return min(range(len(values)), key=values.__getitem__)
