"""Logging setup: plain text for people, one JSON object per line for machines."""

from __future__ import annotations

import logging
import sys
import time

import msgspec

from node.config import LogConfig

_ENCODE = msgspec.json.Encoder().encode


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created)) + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        return _ENCODE(entry).decode()


def setup_logging(config: LogConfig) -> None:
    handler = logging.StreamHandler(sys.stderr)
    if config.log_format == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(config.log_level.upper())
    # Per-request logs stay at debug; these libraries are chatty at info.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
