from __future__ import annotations

import dataclasses

import pytest

from node.configload import ConfigError, build
from node.routing.config import RoutingConfig


def test_defaults_are_smgs() -> None:
    config = RoutingConfig()
    assert (config.cache_threshold, config.balance_abs_threshold, config.balance_rel_threshold) == (0.3, 64, 1.5)
    assert (config.prefix_hash_tokens, config.load_factor, config.prefix_hash_balance_abs_threshold) == (256, 1.25, 10)
    assert (config.page_size_tokens, config.manual_ttl_s) == (16, 4 * 3600.0)
    assert (config.kv_pressure_weight_s, config.default_throughput_tps, config.mean_prefill_tokens) == (
        0.15,
        2000.0,
        1024,
    )
    assert config.routing_key_header == "x-smg-routing-key"


def test_every_field_says_what_it_does() -> None:
    for field in dataclasses.fields(RoutingConfig):
        assert field.metadata.get("help"), field.name


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("cache_threshold", 1.5),
        ("balance_rel_threshold", 0.5),
        ("load_factor", 0.9),
        ("virtual_nodes", 0),
        ("tree_max_pages", 0),
        ("manual_ttl_s", 0.0),
        ("bucket_boundaries_tokens", (512, 256)),
        ("bucket_boundaries_tokens", (0, 256)),
        ("default_throughput_tps", float("inf")),
        ("routing_key_header", " "),
    ],
)
def test_a_bad_value_is_refused_naming_its_key(key: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"^{key}:"):
        RoutingConfig(**{key: value})  # type: ignore[arg-type]


def test_loads_from_env_and_flags_like_every_component() -> None:
    config = build(
        RoutingConfig,
        env={"SMG_NODE_POLICY": "bucket", "SMG_NODE_BUCKET_BOUNDARIES_TOKENS": "512,2048"},
    )
    assert config.policy == "bucket"
    assert config.bucket_boundaries_tokens == (512, 2048)
    with pytest.raises(ConfigError, match="SMG_NODE_POLICY"):
        build(RoutingConfig, env={"SMG_NODE_POLICY": "fastest"})
