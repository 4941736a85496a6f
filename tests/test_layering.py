"""The package layering the code relies on, checked on the source: who may import what."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: What of `mesh` the node may import: its two facades, never the modules behind them.
MESH_PUBLIC = {"mesh", "mesh.state"}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def test_node_imports_only_the_public_api_of_mesh() -> None:
    offenders = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in (ROOT / "node").rglob("*.py")
        for name in _imports(path)
        if (name == "mesh" or name.startswith("mesh.")) and name not in MESH_PUBLIC
    }
    assert not offenders, sorted(offenders)


def test_only_node_cluster_talks_to_the_mesh_state() -> None:
    users = {
        str(path.relative_to(ROOT))
        for path in (ROOT / "node").rglob("*.py")
        if "mesh.state" in _imports(path) and path.parent != ROOT / "node" / "cluster"
    }
    assert not users, sorted(users)


def test_config_is_a_leaf_below_the_components() -> None:
    """node/config.py reads no HTTP handler or pipeline module (they import it, not the other way round)."""
    imported = _imports(ROOT / "node" / "config.py")
    assert not {name for name in imported if name.startswith(("node.http", "node.pipeline", "node.sim"))}


def test_mesh_and_storage_never_import_node_or_each_other() -> None:
    for package, forbidden in (("mesh", ("node", "storage")), ("storage", ("node", "mesh"))):
        for path in (ROOT / package).rglob("*.py"):
            bad = {n for n in _imports(path) if n.split(".")[0] in forbidden}
            assert not bad, f"{path.relative_to(ROOT)} imports {sorted(bad)}"
