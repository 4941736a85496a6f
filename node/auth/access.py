"""Which role may call which route (a pure table, first match wins).

``admin`` may call everything; ``user`` the inference and history APIs (its own tenant's history: the tenant
comes from the identity); ``reader`` status (``/status.json``) and metrics. ``/health`` stays open for
liveness probes, and so does the status page's HTML (``/``, ``/status``): it is the same static file for
everyone and holds no data; it asks the operator for a reader key and sends it on its fetches of
``/status.json`` and ``/metrics``. A path no rule names needs any valid identity, so unknown paths answer 404
only to callers with credentials.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from node.auth.keys import Role

ANY: Final[frozenset[Role]] = frozenset({"admin", "user", "reader"})
ADMIN: Final[frozenset[Role]] = frozenset({"admin"})
USER: Final[frozenset[Role]] = frozenset({"admin", "user"})
READER: Final[frozenset[Role]] = frozenset({"admin", "reader"})


@dataclass(frozen=True, slots=True)
class Rule:
    prefix: str
    #: Methods the rule covers; empty: all.
    methods: frozenset[str]
    #: Roles allowed; None: no credentials needed.
    roles: frozenset[Role] | None
    #: The rule names one path, not a prefix of paths.
    exact: bool = False


def _rule(prefix: str, roles: frozenset[Role] | None, *methods: str) -> Rule:
    return Rule(prefix, frozenset(methods), roles)


def _page(path: str) -> Rule:
    """A static page anyone may load (it fetches its data with the operator's key)."""
    return Rule(path, frozenset({"GET", "HEAD"}), None, exact=True)


RULES: Final[tuple[Rule, ...]] = (
    _rule("/health", None, "GET", "HEAD"),
    _rule("/admin/", ADMIN),
    _rule("/mesh/members", READER, "GET", "HEAD"),
    _rule("/mesh/", ADMIN),  # join: the rogue-cluster attack of issue 14
    _rule("/workers", READER, "GET", "HEAD"),
    _rule("/workers", ADMIN),
    _rule("/metrics", READER),
    _rule("/readiness", READER),
    _page("/"),  # the status page (node/http/status.py); its data is /status.json
    _page("/status"),
    _rule("/status.json", READER, "GET", "HEAD"),
    _rule("/v1/", USER),
)


def allowed_roles(method: str, path: str) -> frozenset[Role] | None:
    """The roles that may call ``method path``; None if the route needs no credentials."""
    for rule in RULES:
        matches = path == rule.prefix if rule.exact else _matches(rule.prefix, path)
        if matches and (not rule.methods or method in rule.methods):
            return rule.roles
    return ANY


def _matches(prefix: str, path: str) -> bool:
    if prefix.endswith("/"):
        return path.startswith(prefix)
    return path == prefix or path.startswith(prefix + "/")
