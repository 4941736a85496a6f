"""The access log: one line per HTTP request on logger ``node.access`` (level info), key=value pairs.

A line is written when the answer is complete (a stream's last byte), so durations are whole. Values a client
chooses (the path) are cut to MAX_PATH_CHARS; the rest are bounded by construction.
"""

from __future__ import annotations

import logging

from node.telemetry.record import RequestRecord

log = logging.getLogger("node.access")

#: A request line may be kilobytes long; the log keeps this much of the path.
MAX_PATH_CHARS = 256


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.1f}"


def access_line(rec: RequestRecord, *, path: str, status: int, duration_s: float) -> str:
    fields = (
        ("method", rec.method),
        ("path", path[:MAX_PATH_CHARS]),
        ("route", rec.route),
        ("status", str(status)),
        ("tenant", rec.tenant or "-"),
        ("model", rec.model or "-"),
        ("worker", rec.worker or "-"),
        ("prompt_tokens", str(rec.prompt_tokens)),
        ("completion_tokens", str(rec.completion_tokens)),
        ("ttft_ms", _ms(rec.ttft_s)),
        ("duration_ms", _ms(duration_s)),
        ("request_id", rec.request_id or "-"),
    )
    return " ".join(f"{key}={value}" for key, value in fields)


def write(rec: RequestRecord, *, path: str, status: int, duration_s: float) -> None:
    if log.isEnabledFor(logging.INFO):
        log.info("%s", access_line(rec, path=path, status=status, duration_s=duration_s))
