"""The package layering the code relies on (README "Architecture"), checked on the source with `ast`: who
may import what.

- `mesh` and `storage` never import `node`, nor each other; `node` imports only mesh's two facades, and only
  node/cluster talks to the replicated state.
- Inside `node`, requests flow http (API adapters) → pipeline → workers/routing, and imports follow that
  direction only: a lower layer never imports a higher one. `node.sim` (the simulated engine) is a worker,
  not part of the gateway: it imports neither http nor pipeline.
- The base modules every layer imports (`node.config`, `node.errors`, `node.tasks`) import no layer above
  workers/routing, or every layer would import the HTTP and pipeline code through them.

Every import counts, including those inside functions and under TYPE_CHECKING.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("node", "mesh", "storage")

# Inside node: a module of rank r may import node modules of rank <= r only.
RANKS = {"node.http": 3, "node.pipeline": 2, "node.workers": 1, "node.routing": 1}

# (importer package or module, forbidden prefixes)
FORBIDDEN: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("mesh", ("node", "storage")),
    ("storage", ("node", "mesh")),
    ("node.sim", ("node.http", "node.pipeline")),
    ("node.config", ("node.http", "node.pipeline", "node.sim")),
    ("node.errors", ("node.http", "node.pipeline", "node.workers", "node.routing")),
    ("node.tasks", ("node.http", "node.pipeline", "node.workers", "node.routing")),
)

# Known violations, each with the work that removes it. Remove an entry once its import is gone (the test
# fails on an allow-listed import that no longer exists, so the list cannot go stale).
ALLOWED: frozenset[tuple[str, str]] = frozenset({
    # The simulated engine reads model folders with the gateway's reader (one reader, not two copies), which
    # lives in the pipeline package; it is no pipeline stage and can move beside node/models/, then this goes.
    ("node.sim.model_folder", "node.pipeline.model"),
    # The simulated engine answers in the model family's markup, found by the gateway's detector (one
    # detector, not two); it is no pipeline stage and can move beside node/models/ with the reader, then this goes.
    ("node.sim.worker", "node.pipeline.parsers.detect"),
})  # fmt: skip

#: What of `mesh` the node may import: its two facades, never the modules behind them.
MESH_PUBLIC = {"mesh", "mesh.state"}


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports(module: str, text: str, *, is_package: bool = False) -> Iterator[str]:
    """Absolute names of the modules ``text`` (module ``module``) imports; ``from a import b`` yields ``a``,
    and ``a.b`` too when that is a module."""
    package = module if is_package else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                anchor = parts[: len(parts) - (node.level - 1)]
                base = ".".join([*anchor, base] if base else anchor)
            yield base
            yield from (f"{base}.{alias.name}" for alias in node.names if _is_module(f"{base}.{alias.name}"))


def _is_module(name: str) -> bool:
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py").is_file() or (path / "__init__.py").is_file()


def _sources() -> Iterator[Path]:
    for package in PACKAGES:
        yield from sorted((ROOT / package).rglob("*.py"))


def _within(name: str, prefix: str) -> bool:
    return name == prefix or name.startswith(prefix + ".")


def _rank(name: str) -> int | None:
    return next((rank for prefix, rank in RANKS.items() if _within(name, prefix)), None)


def _violations(importer: str, text: str, *, is_package: bool = False) -> set[tuple[str, str]]:
    found: set[tuple[str, str]] = set()
    own = _rank(importer)
    for imported in _imports(importer, text, is_package=is_package):
        for owner, prefixes in FORBIDDEN:
            if _within(importer, owner) and any(_within(imported, p) for p in prefixes):
                found.add((importer, imported))
        theirs = _rank(imported)
        if own is not None and theirs is not None and theirs > own:
            found.add((importer, imported))
    return found


def test_imports_follow_the_layers() -> None:
    found: set[tuple[str, str]] = set()
    for path in _sources():
        text = path.read_text(encoding="utf-8")
        found |= _violations(_module_name(path), text, is_package=path.name == "__init__.py")
    # ``from a import b`` reports both a and a.b: keep the most precise name per import.
    precise = {(i, m) for i, m in found if not any(j == i and n.startswith(m + ".") for j, n in found)}
    unexpected = sorted(precise - ALLOWED)
    assert not unexpected, "imports against the layering (README, Architecture):\n" + "\n".join(
        f"  {importer} imports {imported}" for importer, imported in unexpected
    )
    stale = sorted(ALLOWED - precise)
    assert not stale, f"allow-listed imports that no longer exist (remove them from ALLOWED): {stale}"


@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        ("node.pipeline.x", "from node.http.sse import frame\n", {("node.pipeline.x", "node.http.sse")}),
        ("node.workers.x", "import node.pipeline.events\n", {("node.workers.x", "node.pipeline.events")}),
        ("mesh.x", "def f():\n    from node import errors\n", {("mesh.x", "node.errors")}),
        ("storage.x", "from mesh.codec import encode\n", {("storage.x", "mesh.codec")}),
        ("node.pipeline.x", "from ..http import sse\n", {("node.pipeline.x", "node.http.sse")}),
        ("node.tasks", "from node.workers.pool import WorkerPool\n", {("node.tasks", "node.workers.pool")}),
        ("node.http.x", "from node.pipeline.events import Usage\nfrom storage.base import Item\n", set()),
        ("node.pipeline.x", "from node.workers.types import WorkerOutput\n", set()),
    ],
)
def test_the_checker_sees_each_kind_of_import(module: str, source: str, expected: set[tuple[str, str]]) -> None:
    # The checker itself: a layering test that saw nothing would pass forever.
    found = _violations(module, source)
    assert expected <= found if expected else not found


def _top_imports(path: Path) -> set[str]:
    """Absolute module names ``path`` imports."""
    return set(_imports(_module_name(path), path.read_text(encoding="utf-8")))


def test_node_imports_only_the_public_api_of_mesh() -> None:
    offenders = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "node").rglob("*.py")
        for name in _top_imports(path)
        if (name == "mesh" or name.startswith("mesh.")) and name not in MESH_PUBLIC
    }
    assert not offenders, sorted(offenders)


def test_only_node_cluster_talks_to_the_mesh_state() -> None:
    users = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "node").rglob("*.py")
        if "mesh.state" in _top_imports(path) and path.parent != ROOT / "node" / "cluster"
    }
    assert not users, sorted(users)
