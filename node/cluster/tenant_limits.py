"""Per-tenant limits: a replicated registry (``tenant_limits``), set through the admin API on any node and
enforced on every node (node/cluster/limiter.py), beside each key's own limits."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Final

from mesh.state import Change, ClusterState, Json
from node.auth.identity import Limits

TENANT_LIMITS_TABLE: Final = "tenant_limits"
#: Tenants with limits set: one small entry each (~120 bytes), far below the document's compaction bound.
MAX_LIMITED_TENANTS: Final = 4096


class TooManyTenants(Exception):
    pass


def _parse(value: Json | None) -> Limits | None:
    if not isinstance(value, dict):
        return None
    try:
        return Limits(**{k: v for k, v in value.items() if isinstance(v, int)})
    except (TypeError, ValueError):
        return None


class TenantLimits:
    """Call on the state's owner (the event loop) only; reads come from a parsed cache."""

    def __init__(self, state: ClusterState, *, clock: Callable[[], float] = time.time) -> None:
        self._state = state
        self._clock = clock
        self._cache: dict[str, Limits] = {}
        for tenant, value in state.entries(TENANT_LIMITS_TABLE).items():
            self._cache_one(tenant, value)
        state.subscribe(self._on_change)

    def _cache_one(self, tenant: str, value: Json | None) -> None:
        limits = _parse(value)
        if limits is not None and limits.any:
            self._cache[tenant] = limits
        else:
            self._cache.pop(tenant, None)

    def _on_change(self, change: Change) -> None:
        if change.kind == "entry" and change.table == TENANT_LIMITS_TABLE:
            self._cache_one(change.key, change.value)

    def get(self, tenant: str) -> Limits | None:
        return self._cache.get(tenant)

    def all(self) -> dict[str, Limits]:
        return dict(sorted(self._cache.items()))

    def set(self, tenant: str, limits: Limits) -> None:
        """Set (or with all-zero limits, clear) a tenant's limits. Raises TooManyTenants."""
        if not limits.any:
            if tenant in self._cache:
                self._state.remove(TENANT_LIMITS_TABLE, tenant, self._clock())
            self._cache.pop(tenant, None)
            return
        if tenant not in self._cache and len(self._cache) >= MAX_LIMITED_TENANTS:
            raise TooManyTenants(f"at most {MAX_LIMITED_TENANTS} tenants may have limits")
        value: Json = dict(limits.to_json())
        self._state.add(TENANT_LIMITS_TABLE, tenant, value, self._clock())
        self._cache[tenant] = limits
