"""API keys across 3 real meshed node processes: a key created on one node works on the others, and one
revoked on node A is refused on B and C within 1 s (bench/auth_real.py, few trials)."""

from __future__ import annotations

from pathlib import Path

from bench.auth_real import run


def test_a_key_revoked_on_one_node_is_refused_on_the_others_within_a_second(tmp_path: Path) -> None:
    result = run(tmp_path, nodes_count=3, keys=5, seed=7)
    assert result["revoke"]["n"] == 10 and result["create"]["n"] == 10
    assert result["revoke"]["max_ms"] < 1000, result
    assert result["create"]["max_ms"] < 1000, result
