"""The storage layer's error tree.

The HTTP edge maps these once: NotFound -> 404, Conflict -> 409, InvalidInput -> 400,
StorageUnavailable -> 503 (fail fast, the client may retry), StorageContended -> 503 (retry; not an
outage), any other StorageError -> 500. Backend exceptions never escape a store: each backend wraps them
with `raise ... from exc`.
"""


class StorageError(Exception):
    """Base of every error a store raises."""


class NotFound(StorageError):
    """The id does not exist for this tenant (ids of other tenants are indistinguishable from absent ones)."""


class Conflict(StorageError):
    """The write collides with existing state, e.g. a response or item id already exists."""


class InvalidInput(StorageError):
    """The caller passed something the store refuses: a bad id, limit, cursor, metadata or item."""


class StorageUnavailable(StorageError):
    """The backend cannot be reached or did not answer within its timeout.

    A write that raised this may or may not have been applied (the reply can be lost after the commit);
    retrying it is safe because every write is conditional on ids and reports Conflict if it already landed.
    """


class StorageContended(StorageError):
    """The write kept losing to concurrent writes of the same rows (serialization failures, deadlocks)
    through all of the backend's bounded retries. The backend is up and answering: this is not an outage,
    and nothing of the write was applied (each attempt rolled back), so retrying it later is safe."""


class MigrationError(StorageError):
    """The database schema cannot be brought to the version this code needs (e.g. an applied
    migration's checksum differs from the file shipped here). Not transient: operators must act."""
