"""What every discovery source does to the cluster registry: make the workers it owns (by its label value)
equal to the set it found, leaving alone workers registered by hand or by another source."""

from __future__ import annotations

import logging
from collections.abc import Mapping

from node.cluster.registry import WorkerRegistry, WorkerSpec

log = logging.getLogger(__name__)

#: The label naming which discovery source registered a worker (its value: ``dns:<target>``, ``k8s:<ns>``).
DISCOVERY_LABEL = "smg.discovery"


def sync_owned(registry: WorkerRegistry, source: str, found: Mapping[str, WorkerSpec], why: str) -> None:
    """``found``: url -> spec (without the source label, added here). ``why`` ends the log lines."""
    present = registry.specs()
    mine = {wid: s for wid, s in present.items() if s.labels.get(DISCOVERY_LABEL) == source}
    others = {s.url for s in present.values()} - {s.url for s in mine.values()}
    for url, spec in sorted(found.items()):
        if url in others:
            continue  # registered by hand or by another source: not ours to manage
        wanted = WorkerSpec(url=url, model=spec.model, role=spec.role, labels={**spec.labels, DISCOVERY_LABEL: source})
        current = next((s for s in mine.values() if s.url == url), None)
        if current != wanted:
            registry.add(wanted)
            log.info("worker %s %s: %s", url, "added" if current is None else "updated", why)
    for wid, spec in mine.items():
        if spec.url not in found:
            registry.remove(wid)
            log.info("worker %s removed: no longer %s", spec.url, why)
