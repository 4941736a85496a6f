"""Argument checks shared by every backend, so all three refuse exactly the same inputs.

Tenants and response/conversation ids become parts of Redis keys and advisory-lock names, hence the
restrictive alphabets: a ':' in either could make two different (tenant, id) pairs share a key.
"""

import re
from collections.abc import Mapping, Sequence

from storage.base import (
    MAX_ITEMS_PER_ADD,
    MAX_ITEMS_PER_RESPONSE,
    MAX_METADATA_KEY_CHARS,
    MAX_METADATA_PAIRS,
    MAX_METADATA_VALUE_CHARS,
    MAX_PAGE_LIMIT,
    Item,
    Order,
    ResponseRecord,
)
from storage.errors import InvalidInput

# Printable, no whitespace, no ':' (the Redis key separator); 256 chars fits any auth subject or key id.
_TENANT_RE = re.compile(r"[^\x00-\x20\x7f:]{1,256}")
# OpenAI ids are `resp_…`, `conv_…`: letters, digits, '_' and '-'.
_RECORD_ID_RE = re.compile(r"[A-Za-z0-9_-]{1,128}")
MAX_ITEM_ID_CHARS = 256
MAX_ITEM_TYPE_CHARS = 64


def check_tenant(tenant: str) -> None:
    if not _TENANT_RE.fullmatch(tenant):
        raise InvalidInput("tenant must be 1..256 printable characters without whitespace or ':'")


def check_record_id(kind: str, record_id: str) -> None:
    if not _RECORD_ID_RE.fullmatch(record_id):
        raise InvalidInput(f"{kind} id must be 1..128 characters of [A-Za-z0-9_-]: {record_id[:140]!r}")


def check_page(limit: int, order: Order) -> None:
    if not 1 <= limit <= MAX_PAGE_LIMIT:
        raise InvalidInput(f"limit must be between 1 and {MAX_PAGE_LIMIT}, got {limit}")
    if order not in ("asc", "desc"):
        raise InvalidInput(f"order must be 'asc' or 'desc', got {order!r}")


def check_depth(max_depth: int) -> None:
    if max_depth < 1:
        raise InvalidInput(f"max_depth must be at least 1, got {max_depth}")


def check_metadata(metadata: Mapping[str, str]) -> None:
    if len(metadata) > MAX_METADATA_PAIRS:
        raise InvalidInput(f"metadata holds at most {MAX_METADATA_PAIRS} pairs, got {len(metadata)}")
    for key, value in metadata.items():
        if not isinstance(key, str) or not 0 < len(key) <= MAX_METADATA_KEY_CHARS:
            raise InvalidInput(f"metadata keys are strings of 1..{MAX_METADATA_KEY_CHARS} characters")
        if not isinstance(value, str) or len(value) > MAX_METADATA_VALUE_CHARS:
            raise InvalidInput(f"metadata value of {key!r} must be a string of at most 512 characters")


def check_items(items: Sequence[Item], *, max_count: int, min_count: int = 0) -> None:
    """Item ids must be unique within one write: they are pagination cursors."""
    if not min_count <= len(items) <= max_count:
        raise InvalidInput(f"expected {min_count}..{max_count} items, got {len(items)}")
    seen: set[str] = set()
    for item in items:
        if not 0 < len(item.id) <= MAX_ITEM_ID_CHARS:
            raise InvalidInput(f"item ids are 1..{MAX_ITEM_ID_CHARS} characters")
        if not 0 < len(item.type) <= MAX_ITEM_TYPE_CHARS:
            raise InvalidInput(f"item types are 1..{MAX_ITEM_TYPE_CHARS} characters")
        if item.id in seen:
            raise InvalidInput(f"duplicate item id {item.id!r} in one write")
        seen.add(item.id)


def check_added_items(items: Sequence[Item], *, allow_empty: bool) -> None:
    """Items of a Conversations create (may be empty) or add-items (1..20) call."""
    check_items(items, max_count=MAX_ITEMS_PER_ADD, min_count=0 if allow_empty else 1)


def check_response(response: ResponseRecord, input_items: Sequence[Item]) -> None:
    """Input and output ids are checked separately: a client may resend a previous output item (same id)
    as input. Items appended to a conversation must be unique together, though: they share one list."""
    check_record_id("response", response.id)
    if response.previous_response_id is not None:
        check_record_id("previous response", response.previous_response_id)
    output = response.output
    if len(input_items) + len(output) > MAX_ITEMS_PER_RESPONSE:
        raise InvalidInput(f"a response stores at most {MAX_ITEMS_PER_RESPONSE} input+output items")
    check_items(input_items, max_count=MAX_ITEMS_PER_RESPONSE)
    check_items(output, max_count=MAX_ITEMS_PER_RESPONSE)
    if response.conversation_id is not None:
        check_record_id("conversation", response.conversation_id)
        if len({i.id for i in (*input_items, *output)}) != len(input_items) + len(output):
            raise InvalidInput("an input and an output item share an id but both go to one conversation")
