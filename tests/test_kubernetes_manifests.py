"""deploy/kubernetes/ read as Kubernetes would: every node flag is one `smg-node serve` accepts, and the pieces
a rolling upgrade relies on are there (probes, preStop, grace, PDB, headless seed Service, Secrets)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import yaml

from node.cli import build_parser, load_node_config

DIR = Path(__file__).resolve().parent.parent / "deploy" / "kubernetes"


def _docs() -> dict[tuple[str, str], dict[str, Any]]:
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for path in sorted(DIR.glob("*.yaml")):
        for doc in yaml.safe_load_all(path.read_text(encoding="utf-8")):
            if doc and "kind" in doc and "metadata" in doc:
                out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def test_every_manifest_is_listed_by_the_kustomization() -> None:
    listed = set(yaml.safe_load((DIR / "kustomization.yaml").read_text())["resources"])
    assert listed == {p.name for p in DIR.glob("*.yaml")} - {"kustomization.yaml"}


def test_node_args_are_serve_flags() -> None:
    (container,) = _docs()[("Deployment", "smg-node")]["spec"]["template"]["spec"]["containers"]
    args = [re.sub(r"\$\((\w+)\)", "x", a) for a in container["args"]]
    assert args[0] == "serve"
    parsed = build_parser().parse_args(args)  # exits on an unknown flag
    assert parsed.command == "serve"


def test_rolling_upgrade_pieces() -> None:
    docs = _docs()
    pod = docs[("Deployment", "smg-node")]["spec"]["template"]["spec"]
    (node,) = pod["containers"]
    assert node["readinessProbe"]["httpGet"]["path"] == "/readiness"
    assert node["livenessProbe"]["httpGet"]["path"] == "/health"
    pause = node["lifecycle"]["preStop"]["sleep"]["seconds"]
    drain = next(
        int(a.split("=")[1].split()[0])
        for a in node["args"]
        if a.startswith(("--drain-timeout-s", "--shutdown-grace-s"))
    )
    assert pod["terminationGracePeriodSeconds"] > pause + drain
    mesh = docs[("Service", "smg-node-mesh")]["spec"]
    assert mesh["clusterIP"] == "None" and mesh["publishNotReadyAddresses"] is True
    assert any(a.startswith("--join=smg-node-mesh.") for a in node["args"])
    assert docs[("PodDisruptionBudget", "smg-node")]["spec"]["maxUnavailable"] == 1
    secrets = {v["secret"]["secretName"] for v in pod["volumes"] if "secret" in v}
    assert secrets == {"smg-node-mesh-key", "smg-node-mesh-tls", "smg-node-auth"}
    # Pods serve on their pod IP: without a bootstrap key (or --auth none) serve refuses to start open.
    assert any(a.startswith("--auth-bootstrap-key-file=/etc/smg-node/auth/") for a in node["args"])
    assert docs[("Service", "smg-worker")]["spec"]["clusterIP"] == "None"
    assert any(a.startswith("--worker-dns=smg-worker.") for a in node["args"])


def test_nodes_keep_api_keys_in_the_persistent_redis() -> None:
    """Keys made with /admin/keys must work on every pod and survive every pod restarting: the nodes' key
    store is their history backend (node/app.py `_key_store`), the Redis of redis.yaml, which keeps its
    append-only file on a PersistentVolume."""
    docs = _docs()
    (node,) = docs[("Deployment", "smg-node")]["spec"]["template"]["spec"]["containers"]
    pod = {"POD_IP": "10.0.0.7", "POD_NAMESPACE": "smg"}  # what Kubernetes substitutes for $(VAR)
    filled = [re.sub(r"\$\((\w+)\)", lambda m: pod[m.group(1)], a) for a in node["args"]]
    config = load_node_config(build_parser().parse_args(filled))
    assert config.storage.backend == "redis" and not config.auth.keys_file
    service = docs[("Service", urlparse(config.storage.redis_url).hostname or "")]["spec"]
    redis = docs[("StatefulSet", "redis")]["spec"]
    assert redis["replicas"] == 1
    assert service["selector"].items() <= redis["template"]["metadata"]["labels"].items()
    (server,) = redis["template"]["spec"]["containers"]
    assert service["ports"][0]["targetPort"] in {p["name"] for p in server["ports"]}
    args = server["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    (mount,) = server["volumeMounts"]
    assert args[args.index("--dir") + 1] == mount["mountPath"]
    (claim,) = redis["volumeClaimTemplates"]
    assert claim["metadata"]["name"] == mount["name"]
