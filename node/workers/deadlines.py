"""Deadlines of one worker stream: the whole request, the first message, and the gap between messages.

A worker whose health checks pass while its Generate hangs (a wedged engine loop, a SIGSTOPped process
behind a live socket) would otherwise hold the request until the client gives up, and its circuit would never
open. Every Generate stream the gateway reads is therefore bounded three ways (``DeadlineConfig``), tightened
by the client's own timeout where its SDK says it (``deadlines_for``). A tripped deadline raises
``WorkerTimeout``: a worker fault unless the deadline was the client's.

``StreamDeadline`` is the pure part (times in, the next due time and the tripped kind out); ``bounded`` is
the asyncio shell applying it to an async generator on the loop's clock.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Literal, TypeVar

from node.errors import WorkerTimeout

DeadlineKind = Literal["request", "first_token", "idle"]

#: The official OpenAI/Anthropic SDKs in JavaScript send their total per-request timeout here, in whole
#: seconds (``X-Stainless-Timeout: 600``): past it the client has given up.
TOTAL_TIMEOUT_HEADER = "x-stainless-timeout"
#: The Python SDKs send httpx's read timeout here, in seconds (``X-Stainless-Read-Timeout: 600.0``): the
#: longest the client waits for the next bytes. For a streamed answer that bounds the gap between events;
#: for a non-streamed one (one body at the end) it bounds the whole request.
READ_TIMEOUT_HEADER = "x-stainless-read-timeout"

T = TypeVar("T")


def _non_negative(name: str, value: float) -> None:
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"{name} must be a finite number >= 0, got {value}")


@dataclass(frozen=True, slots=True)
class DeadlineConfig:
    """Bounds of every Generate stream the node reads from a worker; 0 switches one off."""

    request_timeout_s: float = field(
        default=600.0,
        metadata={
            "help": "a worker request (prefill to last token) longer than this fails with 504 (0 = no bound); "
            "the OpenAI SDKs' own default timeout"
        },
    )
    first_token_timeout_s: float = field(
        default=120.0,
        metadata={
            "help": "a streamed worker request with no first message within this fails; nothing was relayed "
            "yet, so it is retried elsewhere (0 = no bound). Covers queueing plus the prefill of a 128k prompt "
            "on a busy GPU"
        },
    )
    inter_token_timeout_s: float = field(
        default=60.0,
        metadata={
            "help": "a streamed worker request silent this long between messages fails (0 = no bound); long "
            "enough for a preempted sequence to be recomputed"
        },
    )

    def __post_init__(self) -> None:
        _non_negative("request_timeout_s", self.request_timeout_s)
        _non_negative("first_token_timeout_s", self.first_token_timeout_s)
        _non_negative("inter_token_timeout_s", self.inter_token_timeout_s)


@dataclass(frozen=True, slots=True)
class Limit:
    seconds: float
    client_bound: bool = False  # the client's own timeout, not the node's


@dataclass(frozen=True, slots=True)
class Deadlines:
    """The bounds of one request (None: unbounded)."""

    request: Limit | None = None
    first_token: Limit | None = None
    idle: Limit | None = None


def _node_limit(seconds: float) -> Limit | None:
    return Limit(seconds) if seconds > 0 else None


def _tighter(node: Limit | None, client_s: float | None) -> Limit | None:
    if client_s is None or (node is not None and node.seconds <= client_s):
        return node
    return Limit(client_s, client_bound=True)


def _header_seconds(headers: Mapping[str, str], name: str) -> float | None:
    """A positive finite number of seconds, else None (absent or garbage headers are ignored, not errors:
    they are hints from the client's SDK, never part of the request)."""
    raw = headers.get(name)
    if raw is None:
        return None
    try:
        value = float(raw.strip())
    except ValueError:
        return None
    return value if value > 0 and math.isfinite(value) else None


def deadlines_for(config: DeadlineConfig, headers: Mapping[str, str], *, client_stream: bool) -> Deadlines:
    """The deadlines of one request: the node's, tightened by the client's SDK timeout headers (never loosened).

    ``headers`` must look names up case-insensitively (aiohttp's ``request.headers`` does).
    """
    total_s = _header_seconds(headers, TOTAL_TIMEOUT_HEADER)
    read_s = _header_seconds(headers, READ_TIMEOUT_HEADER)
    request_cap = total_s if client_stream or read_s is None else min(read_s, total_s or math.inf)
    gap_cap = read_s if client_stream else None
    return Deadlines(
        request=_tighter(_node_limit(config.request_timeout_s), request_cap),
        first_token=_tighter(_node_limit(config.first_token_timeout_s), gap_cap),
        idle=_tighter(_node_limit(config.inter_token_timeout_s), gap_cap),
    )


@dataclass(slots=True)
class StreamDeadline:
    """The deadlines of one worker stream started at ``started_at``. Pure: the caller passes the time.

    ``streamed``: the worker sends messages as it generates. Without it the only message is the final one,
    so only the request deadline applies (the first-token and gap bounds would cut every long answer).
    """

    deadlines: Deadlines
    started_at: float
    streamed: bool = True
    last_at: float | None = None  # when the latest message arrived; None: none yet

    @property
    def received(self) -> bool:
        return self.last_at is not None

    def on_message(self, now: float) -> None:
        self.last_at = now  # Watchdog.arrived sets it directly (per message, one call less)

    def next_due(self) -> tuple[float, DeadlineKind, Limit] | None:
        """The earliest deadline still ahead: (absolute time, kind, limit); None when unbounded."""
        d = self.deadlines
        due: list[tuple[float, DeadlineKind, Limit]] = []
        if d.request is not None:
            due.append((self.started_at + d.request.seconds, "request", d.request))
        if self.streamed and self.last_at is None and d.first_token is not None:
            due.append((self.started_at + d.first_token.seconds, "first_token", d.first_token))
        if self.streamed and self.last_at is not None and d.idle is not None:
            due.append((self.last_at + d.idle.seconds, "idle", d.idle))
        return min(due, key=lambda item: item[0]) if due else None

    def expired(self, now: float) -> tuple[DeadlineKind, Limit] | None:
        """The deadline tripped at ``now``, if any."""
        due = self.next_due()
        if due is None or now < due[0]:
            return None
        return due[1], due[2]

    def error(self, kind: DeadlineKind, limit: Limit, url: str) -> WorkerTimeout:
        what = {"request": "did not finish the request", "first_token": "sent nothing", "idle": "went silent"}[kind]
        whose = " (the client's timeout)" if limit.client_bound else ""
        return WorkerTimeout(
            f"worker {url} {what} within {limit.seconds:g} s{whose}",
            kind=kind,
            received=self.received,
            client_bound=limit.client_bound,
        )


class Watchdog:
    """``StreamDeadline`` on the running loop's clock, for a loop that awaits a worker stream itself:
    ``waiting()`` right before each await of the stream, ``arrived()`` after a message, ``timeout()`` when
    that await raised CancelledError, ``stopped_waiting()`` on every other exit from it, ``close()`` at the end.

    One timer per stream, not one per message: it is armed for the earliest deadline and, when it fires early
    (messages arrived meanwhile and moved the deadline on), re-armed for the new one. A streaming answer pays
    a clock read per message instead of a timer set and cancelled per message (a heap push each). It cancels
    the waiting task only while that task waits on the stream.
    """

    __slots__ = ("_cancelling", "_loop", "_now", "_state", "_task", "_timer", "_tripped", "_url", "_waiting")

    def __init__(self, deadlines: Deadlines, *, url: str, streamed: bool = True) -> None:
        self._loop = asyncio.get_running_loop()
        self._now = self._loop.time
        self._state = StreamDeadline(deadlines, started_at=self._now(), streamed=streamed)
        self._url = url
        # The task reading the stream and its cancel count, taken at the first wait (see ``waiting``).
        self._task: asyncio.Task[object] | None = None
        self._cancelling = 0
        self._waiting = False  # the task is awaiting the stream right now
        self._tripped: tuple[DeadlineKind, Limit] | None = None
        self._timer: asyncio.TimerHandle | None = None

    def _arm(self) -> None:
        due = self._state.next_due()
        self._timer = self._loop.call_at(due[0], self._on_timer) if due is not None else None

    def _on_timer(self) -> None:
        self._timer = None
        if not self._waiting or self._task is None:
            return  # not waiting on the worker: armed again at the next wait
        hit = self._state.expired(self._now())
        if hit is None:
            self._arm()
            return
        self._tripped = hit
        self._task.cancel()

    def waiting(self) -> None:
        # Invariant: one task reads a stream for its whole life (an async generator runs in the task that
        # iterates it: Dispatch's attempt in the request's task, each of Run's pump tasks its own dispatch),
        # so the task and its cancel count are taken once, not per message. Cancellations of that task
        # between waits are either raised through the reader (ending the stream) or undone by whoever caught
        # them (asyncio.timeout uncancels); one swallowed without uncancel makes a later trip surface as a
        # plain cancellation, which is asyncio.timeout's rule too.
        if self._task is None:
            task = self._task = asyncio.current_task(self._loop)
            self._cancelling = task.cancelling() if task is not None else 0
        if self._timer is None:
            self._arm()
        self._waiting = True

    def arrived(self) -> None:
        """A message came: the wait is over, the deadlines move on."""
        self._waiting = False
        self._state.last_at = self._now()  # StreamDeadline.on_message, inlined: this runs per message

    def heard(self) -> None:
        """A message came while the task still waits (it was pushed past the reader): the deadlines move on
        (and the idle one starts, if this was the first)."""
        self._state.last_at = self._now()
        if self._timer is None and self._waiting:
            self._arm()

    def stopped_waiting(self) -> None:
        self._waiting = False

    def timeout(self) -> WorkerTimeout | None:
        """After the wait raised CancelledError: the WorkerTimeout to raise instead, when the cancellation was
        this watchdog's and nobody else cancelled the task meanwhile (asyncio.timeout's rule); else None."""
        waiting, self._waiting = self._waiting, False
        task = self._task
        if self._tripped is None or not waiting or task is None or task.uncancel() > self._cancelling:
            return None
        return self._state.error(*self._tripped, self._url)

    def close(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None


async def bounded(
    stream: AsyncGenerator[T, None], deadlines: Deadlines, *, url: str, streamed: bool = True
) -> AsyncGenerator[T, None]:
    """``stream`` under ``deadlines`` (a ``Watchdog``), timed from this call's first step.

    Raises WorkerTimeout when a deadline trips (the stream is closed first, cancelling its RPC); whatever
    ``stream`` raises passes through.
    """
    watch = Watchdog(deadlines, url=url, streamed=streamed)
    try:
        while True:
            watch.waiting()
            try:
                item = await stream.__anext__()  # not anext(): one awaitable less per item
            except StopAsyncIteration:
                watch.stopped_waiting()
                return
            except asyncio.CancelledError:
                timeout = watch.timeout()
                if timeout is not None:
                    raise timeout from None
                raise
            except BaseException:
                watch.stopped_waiting()
                raise
            watch.arrived()
            yield item
    finally:
        watch.close()
        await stream.aclose()
