"""One /metrics for all sibling processes of ``serve --processes N``, whichever of them the kernel hands the
scrape to.

Two kinds of numbers, two ways across processes:

* Instrumented metrics (request counters, latency histograms, in-flight gauges) live in prometheus-client's
  multiprocess mode: every process writes its values to mmap files in the shared directory (the supervisor
  sets PROMETHEUS_MULTIPROC_DIR before the child imports prometheus-client) and a scrape sums them. Counters
  and histograms of a process that died stay in the sum, so totals never go backwards; its live gauges are
  dropped (the supervisor calls ``mark_process_dead``).
* Scrape-time views (worker health, circuit state, mesh, state, KV index, tokenizer cache) are each process's
  own view of the world. Each process labels them ``process="k"`` and writes a snapshot of them every
  ``SNAPSHOT_INTERVAL_S``; a scrape serves its own fresh view plus the siblings' snapshots, merged family by
  family. A snapshot older than ``SNAPSHOT_STALE_S`` (a hung or dead process) is left out.
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest, values
from prometheus_client.metrics_core import Metric
from prometheus_client.multiprocess import MultiProcessCollector, mark_process_dead
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.registry import Collector

#: How often a process refreshes its snapshot: a scrape sees a sibling's view at most this old.
SNAPSHOT_INTERVAL_S = 1.0
#: A snapshot not refreshed for this long belongs to a hung or dead process and is not served.
SNAPSHOT_STALE_S = 10.0
#: The label telling sibling processes' views apart (values 0..N-1: bounded by --processes).
PROCESS_LABEL = "process"
_SNAPSHOT_PREFIX = "snapshot-"
_SNAPSHOT_SUFFIX = ".prom"


class MultiprocessUnset(RuntimeError):
    """The metrics directory is configured but prometheus-client was imported without
    PROMETHEUS_MULTIPROC_DIR, so instrumented values would stay private to this process."""


def check_multiprocess_mode(directory: str) -> None:
    """Raises MultiprocessUnset unless prometheus-client writes its values to ``directory``."""
    if values.ValueClass.__name__ != "MmapedValue" or os.environ.get("PROMETHEUS_MULTIPROC_DIR") != directory:
        raise MultiprocessUnset(f"metrics dir {directory} is set but PROMETHEUS_MULTIPROC_DIR is not the same")


def snapshot_path(directory: str, index: int) -> Path:
    return Path(directory) / f"{_SNAPSHOT_PREFIX}{index}{_SNAPSHOT_SUFFIX}"


def forget_process(directory: str, pid: int, index: int) -> None:
    """A sibling exited: drop its live gauges and its snapshot (its counters stay in the sums)."""
    mark_process_dead(pid, directory)  # type: ignore[no-untyped-call]
    with contextlib.suppress(FileNotFoundError):
        snapshot_path(directory, index).unlink()


class ProcessLabelled(Collector):
    """The families of ``registry`` with ``process="index"`` added to every sample."""

    def __init__(self, registry: CollectorRegistry, index: int) -> None:
        self._registry = registry
        self._index = str(index)

    def collect(self) -> Iterator[Metric]:
        for family in self._registry.collect():
            out = Metric(family.name, family.documentation, family.type, family.unit)
            out.samples = [s._replace(labels={**s.labels, PROCESS_LABEL: self._index}) for s in family.samples]
            yield out


def labelled(view: CollectorRegistry, index: int) -> CollectorRegistry:
    """``view`` with every sample labelled ``process="index"``."""
    registry = CollectorRegistry()
    registry.register(ProcessLabelled(view, index))
    return registry


def write_snapshot(directory: str, index: int, view: CollectorRegistry) -> None:
    """Atomically replace this process's snapshot with ``view``'s current exposition (already labelled)."""
    path = snapshot_path(directory, index)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(generate_latest(view))
    tmp.replace(path)


class SiblingSnapshots(Collector):
    """The fresh snapshots of every sibling but ``index`` (whose view is collected live instead)."""

    def __init__(self, directory: str, index: int) -> None:
        self._directory = Path(directory)
        self._own = snapshot_path(directory, index).name

    def _texts(self) -> Iterator[str]:
        now = time.time()
        for path in sorted(self._directory.glob(f"{_SNAPSHOT_PREFIX}*{_SNAPSHOT_SUFFIX}")):
            if path.name == self._own:
                continue
            try:
                if now - path.stat().st_mtime > SNAPSHOT_STALE_S:
                    continue
                yield path.read_text(encoding="utf-8")
            except FileNotFoundError:  # removed by the supervisor between the glob and the read
                continue

    def collect(self) -> Iterator[Metric]:
        for text in self._texts():
            yield from text_string_to_metric_families(text)


class Merged(Collector):
    """Families of several collectors with the same name served as one (the exposition format allows
    each name once); samples are distinct by their process label, so nothing is summed here."""

    def __init__(self, parts: Iterable[Collector]) -> None:
        self._parts = tuple(parts)

    def collect(self) -> Iterator[Metric]:
        families: dict[str, Metric] = {}
        for part in self._parts:
            for family in part.collect():
                held = families.get(family.name)
                if held is None:
                    held = families[family.name] = Metric(family.name, family.documentation, family.type, family.unit)
                held.samples.extend(family.samples)
        yield from families.values()


def node_registry(directory: str, view: CollectorRegistry, index: int) -> CollectorRegistry:
    """What a scrape of any sibling serves: the summed instrumented metrics and every process's view."""
    registry = CollectorRegistry()
    MultiProcessCollector(registry, path=directory)  # type: ignore[no-untyped-call]
    registry.register(Merged([ProcessLabelled(view, index), SiblingSnapshots(directory, index)]))
    return registry
