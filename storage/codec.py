"""JSON text <-> records. Backends store item and response bodies as JSON text (memory included, so a
caller mutating a dict after put() cannot change what is stored, and every backend rejects the same
non-JSON values)."""

from collections.abc import Mapping
from typing import Any

import msgspec

from storage.base import Item
from storage.errors import InvalidInput, StorageError

_DECODER = msgspec.json.Decoder()


def _enc_hook(value: object) -> object:
    # msgspec encodes dict but not other Mappings (e.g. MappingProxyType); accept any Mapping.
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


_ENCODER = msgspec.json.Encoder(enc_hook=_enc_hook)


def dumps(value: object) -> str:
    """Raises InvalidInput if the value is not JSON-serializable."""
    try:
        return _ENCODER.encode(value).decode()
    except (TypeError, ValueError, msgspec.EncodeError) as exc:
        raise InvalidInput(f"not JSON serializable: {exc}") from exc


def _loads(text: str | bytes) -> Any:
    try:
        return _DECODER.decode(text)
    except msgspec.DecodeError as exc:
        raise StorageError("stored JSON is corrupt") from exc


def loads_object(text: str | bytes) -> dict[str, object]:
    """Raises StorageError if the stored text is not a JSON object (corruption, never a caller error)."""
    value = _loads(text)
    if not isinstance(value, dict):
        raise StorageError("stored JSON is not an object")
    return value


def item_from_text(text: str | bytes) -> Item:
    return Item.from_json(loads_object(text))


def items_from_array_text(text: str | bytes) -> tuple[Item, ...]:
    """Decode a stored JSON array of item objects. Raises StorageError if it is not one."""
    values = _loads(text)
    if not isinstance(values, list) or not all(isinstance(v, dict) for v in values):
        raise StorageError("stored JSON is not an array of objects")
    return tuple(Item.from_json(v) for v in values)


def metadata_from_text(text: str | bytes) -> dict[str, str]:
    return {str(k): str(v) for k, v in loads_object(text).items()}
