"""The merge of sibling processes' views (node/telemetry/multiproc.py) without processes: labels, one family
per name, stale snapshots left out."""

from __future__ import annotations

import os
import time
from pathlib import Path

from prometheus_client import CollectorRegistry, Gauge, generate_latest

from node.telemetry.multiproc import (
    SNAPSHOT_STALE_S,
    Merged,
    ProcessLabelled,
    SiblingSnapshots,
    labelled,
    snapshot_path,
    write_snapshot,
)


def _view(value: float) -> CollectorRegistry:
    registry = CollectorRegistry()
    Gauge("smg_node_worker_healthy", "1 if in rotation.", ["worker"], registry=registry).labels("w1").set(value)
    return registry


def _served(tmp_path: Path, own: int) -> str:
    registry = CollectorRegistry()
    registry.register(Merged([ProcessLabelled(_view(1.0), own), SiblingSnapshots(str(tmp_path), own)]))
    return generate_latest(registry).decode()


def test_siblings_views_are_merged_into_one_family(tmp_path: Path) -> None:
    write_snapshot(str(tmp_path), 1, labelled(_view(0.0), 1))
    write_snapshot(str(tmp_path), 0, labelled(_view(0.0), 0))  # our own stale copy: the live view wins
    text = _served(tmp_path, 0)
    assert text.count("# TYPE smg_node_worker_healthy gauge") == 1
    assert 'smg_node_worker_healthy{process="0",worker="w1"} 1.0' in text
    assert 'smg_node_worker_healthy{process="1",worker="w1"} 0.0' in text
    assert text.count("smg_node_worker_healthy{") == 2


def test_a_stale_snapshot_is_left_out(tmp_path: Path) -> None:
    write_snapshot(str(tmp_path), 1, labelled(_view(0.0), 1))
    old = time.time() - SNAPSHOT_STALE_S - 1
    os.utime(snapshot_path(str(tmp_path), 1), (old, old))
    assert 'process="1"' not in _served(tmp_path, 0)
