"""The gateway's tokenizer: a thin, typed face over Hugging Face ``tokenizers`` loaded from tokenizer.json.

`Tokenizer.encode` is the single choke point for text -> ids; faster paths (a tiktoken BPE, caches) slot in
behind it later and must stay id-identical to the Hugging Face result.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

import tokenizers

from node.pipeline.model import ModelFolderError

TOKENIZER_FILE = "tokenizer.json"
# encode_batch_fast skips offset tracking (~2x faster); older tokenizers releases lack it.
_HAS_FAST_BATCH = hasattr(tokenizers.Tokenizer, "encode_batch_fast")


class Tokenizer:
    """Encodes and decodes with one vocabulary. Immutable after construction and safe to share across
    threads (the underlying Rust tokenizer takes ``&self`` for encode/decode)."""

    __slots__ = ("_raw", "fingerprint", "special_token_ids", "vocab_size")

    def __init__(self, raw: tokenizers.Tokenizer, *, fingerprint: str) -> None:
        self._raw = raw
        # Identifies the vocabulary and its rules: two tokenizers with the same fingerprint produce the
        # same ids, so token-level caches and KV-aware routing may key on it.
        self.fingerprint = fingerprint
        self.vocab_size: int = raw.get_vocab_size(with_added_tokens=True)
        self.special_token_ids: frozenset[int] = frozenset(
            token_id for token_id, token in raw.get_added_tokens_decoder().items() if token.special
        )

    @classmethod
    def from_bytes(cls, data: bytes) -> Tokenizer:
        """Build from the contents of a tokenizer.json.

        Raises:
            ValueError: ``data`` is not a tokenizer definition the ``tokenizers`` library accepts.
        """
        try:
            raw = tokenizers.Tokenizer.from_buffer(data)
        except Exception as exc:  # the binding raises a bare Exception for every parse failure
            raise ValueError(f"not a valid tokenizer definition: {exc}") from exc
        return cls(raw, fingerprint=hashlib.sha256(data).hexdigest())

    @classmethod
    def from_file(cls, path: Path) -> Tokenizer:
        """Load a tokenizer.json file, or the one inside a model folder if ``path`` is a directory.

        Raises:
            ModelFolderError: the file is missing, unreadable or not a valid tokenizer (names the file).
        """
        file = path / TOKENIZER_FILE if path.is_dir() else path
        try:
            data = file.read_bytes()
        except OSError as exc:
            raise ModelFolderError(file, f"cannot read: {exc.strerror or exc}") from exc
        try:
            return cls.from_bytes(data)
        except ValueError as exc:
            raise ModelFolderError(file, str(exc)) from exc

    @property
    def raw(self) -> tokenizers.Tokenizer:
        """The underlying Hugging Face tokenizer, e.g. for ``tokenizers.decoders.DecodeStream``."""
        return self._raw

    def encode(self, text: str, *, add_special_tokens: bool) -> list[int]:
        """Ids for ``text``. ``add_special_tokens`` applies the tokenizer's post-processor (e.g. a leading
        BOS); pass False for text rendered by a chat template, which already contains its special tokens."""
        return self._raw.encode(text, add_special_tokens=add_special_tokens).ids

    def encode_batch(self, texts: Sequence[str], *, add_special_tokens: bool) -> list[list[int]]:
        """``[encode(t) for t in texts]``, computed in parallel (same ids, by contract)."""
        batch = list(texts)
        if _HAS_FAST_BATCH:
            encodings = self._raw.encode_batch_fast(batch, add_special_tokens=add_special_tokens)
        else:
            encodings = self._raw.encode_batch(batch, add_special_tokens=add_special_tokens)
        return [encoding.ids for encoding in encodings]

    def decode(self, ids: Sequence[int], *, skip_special_tokens: bool) -> str:
        """Text for ``ids``; ``skip_special_tokens`` drops the ids in `special_token_ids`."""
        return self._raw.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """The id of one token string (e.g. ``"<|eot_id|>"``), or None if it is not in the vocabulary."""
        return self._raw.token_to_id(token)

    def id_to_token(self, token_id: int) -> str | None:
        """The token string of one id, or None if the id is out of range."""
        return self._raw.id_to_token(token_id)
