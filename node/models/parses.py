"""One parse of a tokenizer.json for every component of a process that loads it.

The demo runs a node and its simulated workers in one process, and each loads the same model folder: parsing
a 128k-vocabulary tokenizer.json with `tokenizers` costs ~0.6 s of CPU with the GIL held, once per load. A
`TokenizerParses` handed to both makes it one parse. Entries are keyed by the file's SHA-256, so a file that
changed between two loads is parsed anew, never served stale. The parsed `tokenizers.Tokenizer` is shared
read-only: no loader configures padding, truncation or added tokens on it.
"""

from __future__ import annotations

import hashlib
import threading

import tokenizers


class TokenizerParses:
    """Parsed tokenizer definitions by content hash, for the lifetime of the loaders sharing it."""

    __slots__ = ("_lock", "_parsed")

    def __init__(self) -> None:
        # Held across a parse: a second loader of the same file waits for it instead of parsing it too.
        self._lock = threading.Lock()
        self._parsed: dict[str, tokenizers.Tokenizer] = {}

    def parse(self, data: bytes, digest: str | None = None) -> tokenizers.Tokenizer:
        """The `tokenizers` parse of ``data`` (a tokenizer.json's contents; ``digest`` its SHA-256 hex digest,
        if the caller has it already).

        Raises:
            Exception: the binding's (bare) exception for a definition it does not accept; nothing is kept.
        """
        key = digest if digest is not None else hashlib.sha256(data).hexdigest()
        with self._lock:
            raw = self._parsed.get(key)
            if raw is None:
                raw = tokenizers.Tokenizer.from_buffer(data)
                self._parsed[key] = raw
            return raw
