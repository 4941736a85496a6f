"""The request pipeline every API adapter drives, whichever API it speaks:

    adapter parses its body   → GenerateRequest            (node/pipeline/request.py)
    Prepare                   → Prepared: GenerateSpec(s)  (node/pipeline/prepare.py)
    Dispatch per spec         → worker messages            (node/pipeline/dispatch.py)
    Output per choice         → typed events               (node/pipeline/output.py, events.py)
    adapter renders events    → its JSON / SSE / errors

``RequestContext`` (node/pipeline/context.py) is made at the HTTP edge and passed to every stage.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

from node.config import RequestLimits
from node.pipeline.context import RequestContext
from node.pipeline.cpu import CpuPool
from node.pipeline.dispatch import DispatchConfig
from node.pipeline.events import Usage
from node.pipeline.output import Stages
from node.pipeline.parser_stage import parser_stages
from node.pipeline.prepare import Prepare, check_sampling
from node.pipeline.request import GenerateRequest, Sampling
from node.pipeline.run import Run
from node.pipeline.served_model import ServedModel
from node.pipeline.spec import Prepared
from node.workers.deadlines import DeadlineConfig
from node.workers.pool import WorkerPool
from node.workers.retry import RetryConfig, RetryPolicy


def _ignore_usage(usage: Usage) -> None:
    return None


def _admit_all(prepared: Prepared, run: Run) -> None:
    return None


class Pipeline:
    """Built once by the app; shared by every adapter."""

    def __init__(
        self,
        *,
        models: Sequence[ServedModel],
        pool: WorkerPool,
        cpu: CpuPool,
        limits: RequestLimits | None = None,
        on_usage: Callable[[Usage], None] = _ignore_usage,
        on_admit: Callable[[Prepared, Run], None] = _admit_all,
        retry: RetryConfig | None = None,
        deadlines: DeadlineConfig | None = None,
        rng: random.Random | None = None,
        stages: Stages | None = None,
    ) -> None:
        """``rng`` draws the retry backoff (a seeded one makes it reproducible); ``stages`` makes each
        choice's text stages (default: the output parsers Prepare planned for the request); ``on_admit``
        sees each prepared request and its run before Dispatch starts and may refuse it by raising (token
        reservation and metering)."""
        self.models = tuple(models)
        self._prepare = Prepare(models, cpu, limits or RequestLimits())
        self._pool = pool
        self._on_usage = on_usage
        self._on_admit = on_admit
        self._dispatch = DispatchConfig(
            retry=RetryPolicy(retry or RetryConfig(), rng or random.Random()),
            deadlines=deadlines or DeadlineConfig(),
        )
        self._stages = stages if stages is not None else parser_stages

    def model(self, requested: str) -> ServedModel:
        """Model lookup, the first step of Prepare; raises ModelNotFound (404)."""
        return self._prepare.model(requested)

    def check(self, sampling: Sampling, model: ServedModel) -> None:
        """Prepare's checks of the sampling fields alone, for an adapter that must refuse bad input before
        it does work of its own (the Responses API reads stored history). Raises InvalidRequest."""

        check_sampling(sampling, model)

    async def prepare(
        self, request: GenerateRequest, model: ServedModel, ctx: RequestContext, *, request_id: str
    ) -> Prepared:
        """The Prepare stage. Raises InvalidRequest, ContextLengthExceeded."""
        return await self._prepare(request, model, ctx, request_id=request_id)

    def run(self, prepared: Prepared, ctx: RequestContext) -> Run:
        """Dispatch and Output for ``prepared``; iterate the result's ``events()``. Raises what ``on_admit``
        raises (RateLimited) before any worker sees the request."""
        run = Run(
            prepared,
            pool=self._pool,
            dispatch=self._dispatch,
            stages=self._stages,
            on_usage=self._on_usage,
            client_timeouts=ctx.headers,
        )  # built, not started: Dispatch begins when its events are iterated
        self._on_admit(prepared, run)
        return run
