"""The metrics' tenant label is bounded (--metrics-max-tenants): on a real node, the first N distinct tenants keep
their name, later ones fold into ':other', and 0 turns the tenant metrics off."""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from node.app import RunningNode, run_node
from node.config import ApiConfig, TelemetryConfig
from node.sim.worker import SimWorker
from tests.http.conftest import fast_sim, node_config


@contextlib.asynccontextmanager
async def _node(model_dir: Path, max_tenants: int) -> AsyncIterator[RunningNode]:
    async with contextlib.AsyncExitStack() as stack:
        sim = await stack.enter_async_context(SimWorker(fast_sim(model_dir)))
        config = dataclasses.replace(
            node_config(model_dir, [sim.port]),
            api=ApiConfig(trust_tenant_header=True),
            telemetry=TelemetryConfig(metrics_max_tenants=max_tenants),
        )
        yield await stack.enter_async_context(run_node(config))


async def _tenant_samples(node: RunningNode, tenants: list[str]) -> dict[tuple[str, str, str], float]:
    """Send one completion per tenant; return the tenant metrics' samples: (name, tenant, status|kind) -> value."""
    async with aiohttp.ClientSession() as session:
        for tenant in tenants:
            body = {"model": node.model.name, "prompt": "Once upon", "max_tokens": 3}
            async with session.post(f"{node.url}/v1/completions", json=body, headers={"X-SMG-Tenant": tenant}) as r:
                assert r.status == 200, await r.text()
        async with session.get(node.url + "/metrics") as r:
            text = await r.text()
    out: dict[tuple[str, str, str], float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.startswith("smg_node_tenant_") and sample.name.endswith("_total"):
                labels = sample.labels
                out[(sample.name, labels["tenant"], labels.get("status") or labels["kind"])] = sample.value
    return out


async def test_the_first_tenants_keep_their_name_and_the_rest_fold_into_other(llama3_model_dir: Path) -> None:
    async with _node(llama3_model_dir, max_tenants=2) as node:
        samples = await _tenant_samples(node, ["acme", "globex", "acme", "initech", "umbrella", "globex"])
    requests = {t: v for (name, t, s), v in samples.items() if name == "smg_node_tenant_requests_total" and s == "200"}
    assert requests == {"acme": 2, "globex": 2, ":other": 2}
    completion = {
        t: v for (name, t, k), v in samples.items() if name == "smg_node_tenant_tokens_total" and k == "completion"
    }
    assert completion == {"acme": 6, "globex": 6, ":other": 6}  # 3 tokens each
    assert samples[("smg_node_tenant_tokens_total", "acme", "prompt")] > 0


async def test_zero_turns_the_tenant_metrics_off(llama3_model_dir: Path) -> None:
    async with _node(llama3_model_dir, max_tenants=0) as node:
        assert await _tenant_samples(node, ["acme"]) == {}


def test_the_bound_is_checked() -> None:
    with pytest.raises(ValueError, match="metrics_max_tenants"):
        TelemetryConfig(metrics_max_tenants=-1)
