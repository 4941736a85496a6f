"""Latency arithmetic and FIFO admission: pure, no loop."""

from __future__ import annotations

import pytest

from node.sim.admission import AdmissionQueue
from node.sim.config import SimWorkerConfig
from node.sim.latency import LatencyModel


def test_latency_arithmetic() -> None:
    model = LatencyModel(ttft_base_ms=5, ttft_per_uncached_token_ms=0.5, tpot_ms=2, tpot_per_running_ms=0.25)
    assert model.prefill_s(100) == pytest.approx(0.055)
    assert model.prefill_s(0) == pytest.approx(0.005)
    assert model.token_s(4) == pytest.approx(0.003)
    assert model.chunk_s(first=True, tokens=1, uncached_tokens=100, running=4) == pytest.approx(0.055)
    assert model.chunk_s(first=True, tokens=3, uncached_tokens=100, running=4) == pytest.approx(0.061)
    assert model.chunk_s(first=False, tokens=3, uncached_tokens=100, running=4) == pytest.approx(0.009)
    assert not model.is_zero
    assert LatencyModel().is_zero
    assert LatencyModel().chunk_s(first=True, tokens=5, uncached_tokens=1000, running=100) == 0


def test_latency_model_from_config_defaults() -> None:
    model = LatencyModel.from_config(SimWorkerConfig())
    assert model.prefill_s(1000) == pytest.approx(0.025)
    assert model.token_s(1) == pytest.approx(0.00202)


def test_admission_runs_up_to_the_cap_then_queues_fifo() -> None:
    queue: AdmissionQueue[str] = AdmissionQueue(2)
    assert queue.submit("a") and queue.submit("b")
    assert not queue.submit("c")
    assert not queue.submit("d")
    assert (queue.running, queue.waiting) == (2, 2)
    assert queue.waiting_keys() == ["c", "d"]
    assert queue.release("a") == ["c"]
    assert queue.is_running("c")
    assert queue.release("d") == []  # leaving the queue frees no slot
    assert queue.release("b") == []
    assert (queue.running, queue.waiting) == (1, 0)


def test_admission_keeps_order_when_a_slot_is_free_but_others_wait() -> None:
    queue: AdmissionQueue[int] = AdmissionQueue(1)
    assert queue.submit(1)
    assert not queue.submit(2)
    assert queue.release(1) == [2]
    with pytest.raises(ValueError):
        queue.submit(2)
    with pytest.raises(ValueError):
        AdmissionQueue(0)
