"""The demo's start imports only what it runs (issue 17: imports were the largest part of its time to first
answer). Each module below is used by a feature the demo has off (a mesh, its keyring, JWT auth, Kubernetes
discovery, a YAML config file, the storage backends) and is imported where that feature starts; an eager import
added back anywhere on the demo's path fails here."""

from __future__ import annotations

import subprocess
import sys

import pytest

# The modules `smg-node demo` imports (node.cli's cmd_demo imports the rest inside the function).
DEMO_IMPORTS = "import node.cli, node.app, node.models.prepare, node.sim.worker"

NOT_ON_THE_DEMO_PATH = (
    "mesh.runtime",  # the SWIM runtime: a node without a mesh never starts it
    "mesh.swim",
    "mesh.codec",
    "mesh.tls",
    "mesh.keyring",
    "cryptography",  # the mesh keyring, mesh TLS and JWT signatures
    "jwt",
    "node.auth.jwt_auth",
    "node.discovery.kubernetes",
    "yaml",  # --config only
    "asyncpg",  # the Postgres and Redis stores, opened by name
    "redis",
    "hypothesis",  # tests only
    "opentelemetry.sdk",  # tracing on only (tests/telemetry/test_tracing.py)
)


def _imported_after(code: str) -> set[str]:
    probe = f"{code}; import sys; print('\\n'.join(sys.modules))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True, timeout=120)
    return set(done.stdout.split())


def test_the_demo_path_imports_no_module_of_a_feature_it_has_off() -> None:
    loaded = _imported_after(DEMO_IMPORTS)
    eager = sorted(m for m in loaded for heavy in NOT_ON_THE_DEMO_PATH if m == heavy or m.startswith(heavy + "."))
    assert eager == []


def test_the_mesh_facade_loads_its_lazy_names_on_first_use() -> None:
    import mesh
    from mesh.keyring import Keyring
    from mesh.runtime import Mesh
    from mesh.swim import Swim

    assert (mesh.Mesh, mesh.Swim, mesh.Keyring) == (Mesh, Swim, Keyring)
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        _ = mesh.Nope
