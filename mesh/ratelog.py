"""Rate-limited logging of refused input: one line per kind and interval, with the count it stood for.

A flood of bad packets or connections must not flood the log too; the counters in MeshMetrics count every
refusal, the log says that refusals happen, why, and from where (the latest one). Time is passed in, so the
sans-IO core can use it too.
"""

from __future__ import annotations

import logging

from mesh.limits import REFUSAL_LOG_INTERVAL_S


class RefusalLog:
    """Logs at most one line per ``kind`` every ``interval_s`` seconds."""

    def __init__(self, logger: logging.Logger, interval_s: float = REFUSAL_LOG_INTERVAL_S) -> None:
        self._log = logger
        self._interval_s = interval_s
        #: kind -> (time of the last line, refusals not logged since)
        self._last: dict[str, tuple[float, int]] = {}

    def refused(self, now: float, kind: str, detail: str, level: int = logging.WARNING) -> None:
        last, suppressed = self._last.get(kind, (float("-inf"), 0))
        if now - last < self._interval_s:
            self._last[kind] = (last, suppressed + 1)
            return
        self._last[kind] = (now, 0)
        more = f" ({suppressed} more since the last report)" if suppressed else ""
        self._log.log(level, "mesh: %s: %s%s", kind, detail, more)
