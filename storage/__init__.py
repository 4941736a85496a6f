"""Conversation history behind the OpenAI Responses and Conversations APIs: records, store Protocols,
errors, config and open_stores(). Never imports `node` or `mesh`."""

from storage.base import (
    Conversation,
    ConversationStore,
    Item,
    ItemPage,
    Order,
    ResponseRecord,
    ResponseStore,
    Stores,
)
from storage.config import StorageConfig
from storage.errors import (
    Conflict,
    InvalidInput,
    MigrationError,
    NotFound,
    StorageContended,
    StorageError,
    StorageUnavailable,
)
from storage.factory import open_stores

__all__ = [
    "Conflict",
    "Conversation",
    "ConversationStore",
    "InvalidInput",
    "Item",
    "ItemPage",
    "MigrationError",
    "NotFound",
    "Order",
    "ResponseRecord",
    "ResponseStore",
    "StorageConfig",
    "StorageContended",
    "StorageError",
    "StorageUnavailable",
    "Stores",
    "open_stores",
]
