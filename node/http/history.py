"""The history stores as the HTTP edge uses them: storage errors mapped once to API errors, and fail-fast
while the backend is known to be down.

Mapping: NotFound -> 404, Conflict -> 409, InvalidInput -> 400, StorageUnavailable -> 503
`storage_unavailable`, StorageContended -> 503 `storage_contended` (concurrent writes to the same rows
outlasted the backend's retries: the backend answered, so the outage gate stays shut), any other
StorageError (a database error the backend does not classify, a schema that cannot be migrated) -> 500
`storage_error`, logged with its cause. Every storage error thus becomes a GatewayError: a JSON answer gets
the API's error envelope, a stream ends with response.failed. The backend's own detail (addresses, driver
errors, SQL states) goes to the log, not to the client.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

from node.errors import GatewayError, InvalidRequest, NotFound
from node.telemetry import record
from node.telemetry.spans import stage_span
from storage import errors as storage_errors
from storage.base import ConversationStore, ResponseStore, Stores

log = logging.getLogger(__name__)

T = TypeVar("T")

# After a StorageUnavailable, requests that need storage fail at once for this long instead of each waiting
# out a connect timeout (or generating an answer that cannot be stored); the first request after it probes
# the backend again, so recovery needs no restart and is noticed within this bound.
OUTAGE_HOLD_S = 1.0
# A store that answered within this long is taken to be up. Past it, a request about to generate an answer it
# must store first reads one absent response id (one round trip), so an outage nobody has noticed yet fails the
# request before generation instead of after it. Under steady traffic the store answers more often than this
# and no probe runs; an idle node pays one round trip on its next such request.
PROBE_AFTER_S = 1.0
PROBE_RESPONSE_ID = "resp_reachability_probe"

UNAVAILABLE_MESSAGE = (
    "The response history store is unavailable; retry later. Requests with store=false and without "
    "previous_response_id or conversation do not need it."
)
CONTENDED_MESSAGE = "Concurrent requests kept changing the same stored response or conversation; retry this request."
FAILED_MESSAGE = (
    "The response history store failed to process this request. Requests with store=false and without "
    "previous_response_id or conversation do not need it."
)


class StorageUnavailableError(GatewayError):
    status = 503
    error_type = "service_unavailable"
    code = "storage_unavailable"


class StorageContendedError(GatewayError):
    status = 503
    error_type = "service_unavailable"
    code = "storage_contended"


class StorageFailed(GatewayError):
    status = 500
    error_type = "server_error"
    code = "storage_error"


class StorageConflict(GatewayError):
    status = 409
    error_type = "invalid_request_error"
    code = "conflict"


class OutageGate:
    """Remembers a recent backend outage, and when the backend last answered. Pure: the clock is injected."""

    __slots__ = ("_answered_at", "_clock", "_hold_s", "_open_until")

    def __init__(self, hold_s: float = OUTAGE_HOLD_S, clock: Callable[[], float] = time.monotonic) -> None:
        self._hold_s = hold_s
        self._clock = clock
        self._open_until = float("-inf")
        self._answered_at = float("-inf")

    def is_open(self) -> bool:
        """True while the backend is presumed down (a failure within the last hold_s)."""
        return self._clock() < self._open_until

    def failed(self) -> None:
        self._open_until = self._clock() + self._hold_s

    def succeeded(self) -> None:
        self._open_until = float("-inf")
        self._answered_at = self._clock()

    def answered_within(self, seconds: float) -> bool:
        """True when the backend answered (successfully or with a domain error) within the last ``seconds``."""
        return self._clock() - self._answered_at <= seconds


class History:
    """Both stores behind one outage gate. Every storage call of the HTTP layer goes through `run`."""

    def __init__(self, stores: Stores, gate: OutageGate | None = None) -> None:
        self.responses: ResponseStore = stores.responses
        self.conversations: ConversationStore = stores.conversations
        self._gate = gate or OutageGate()

    def check_available(self) -> None:
        """Raises StorageUnavailableError (503) while a recent outage has not been probed again."""
        if self._gate.is_open():
            raise StorageUnavailableError(UNAVAILABLE_MESSAGE)

    async def ensure_reachable(self, tenant: str) -> None:
        """Before generating an answer that must be stored: raises StorageUnavailableError (503) while an
        outage is known, or when the store has not answered for PROBE_AFTER_S and a cheap read (an absent
        response id of ``tenant``) now finds it unreachable. Any answer to that read, even an error that is
        no outage, counts as reachable: the write reports its own errors."""
        self.check_available()
        if self._gate.answered_within(PROBE_AFTER_S):
            return
        try:
            await self.responses.get(tenant, PROBE_RESPONSE_ID)
        except storage_errors.StorageUnavailable as exc:
            raise self._unavailable(exc) from exc
        except storage_errors.NotFound:
            pass  # the expected answer
        except storage_errors.StorageError:
            return  # reachable, though not well: leave the gate as it is
        self._gate.succeeded()

    def _unavailable(self, exc: storage_errors.StorageUnavailable) -> StorageUnavailableError:
        self._gate.failed()
        log.warning("history store unavailable: %s", exc)
        return StorageUnavailableError(UNAVAILABLE_MESSAGE)

    async def run(self, op: Callable[[], Awaitable[T]], *, param: str | None = None) -> T:
        """Await one store call, mapping storage errors to API errors (``param`` names the request field
        the ids came from). Raises StorageUnavailableError, StorageContendedError, NotFound,
        StorageConflict, InvalidRequest, StorageFailed."""
        self.check_available()
        try:
            with stage_span(record.current(), "storage", param=param or ""):
                result = await op()
        except storage_errors.StorageUnavailable as exc:
            raise self._unavailable(exc) from exc
        except storage_errors.StorageContended as exc:
            self._gate.succeeded()  # the backend answered: contention is no outage
            log.warning("history store contended: %s", exc)
            raise StorageContendedError(CONTENDED_MESSAGE, param=param) from exc
        except storage_errors.NotFound as exc:
            self._gate.succeeded()
            raise NotFound(_sentence(exc), param=param) from exc
        except storage_errors.Conflict as exc:
            self._gate.succeeded()
            raise StorageConflict(_sentence(exc), param=param) from exc
        except storage_errors.InvalidInput as exc:
            raise InvalidRequest(_sentence(exc), param=param) from exc
        except storage_errors.StorageError as exc:
            # Not an outage (the gate stays as it is): the backend answered, with something unexpected.
            log.error("history store error: %s", exc, exc_info=exc)
            raise StorageFailed(FAILED_MESSAGE) from exc
        self._gate.succeeded()
        return result


def _sentence(exc: Exception) -> str:
    text = str(exc)
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")
