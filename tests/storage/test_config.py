"""StorageConfig: defaults are valid, every field is documented for the generic flag loader, and bad
values are rejected naming the field."""

from __future__ import annotations

import dataclasses

import pytest

from storage import StorageConfig, Stores, open_stores


def test_every_field_has_a_flag_and_help() -> None:
    flags = []
    for f in dataclasses.fields(StorageConfig):
        assert f.metadata.get("help"), f.name
        flags.append(f.metadata["flag"])
        # Store-specific settings are --history-*; the two server URLs use the names users know.
        assert f.metadata["flag"].startswith("--history-") or f.metadata["flag"] in ("--redis-url", "--postgres-url")
    assert len(set(flags)) == len(flags)
    backend = next(f for f in dataclasses.fields(StorageConfig) if f.name == "backend")
    assert backend.metadata["flag"] == "--history-backend"
    assert StorageConfig().backend == "memory"


def test_urls_are_kept_out_of_repr() -> None:
    text = repr(StorageConfig(postgres_url="postgresql://u:secret@h/db", redis_url="redis://:secret@h"))
    assert "secret" not in text


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("backend", "sqlite"),
        ("table_prefix", "Bad-Prefix"),
        ("table_prefix", "x" * 41),
        ("key_prefix", "a:b"),
        ("retention_s", 0),
        ("retention_s", 4e9),  # over 100 years
        ("retention_s", float("inf")),
        ("postgres_sweep_interval_s", 0.0),
        ("connect_timeout_s", -1.0),
        ("command_timeout_s", 0.0),
        ("memory_max_items", 0),
        ("postgres_pool_min_size", -1),
        ("postgres_pool_max_size", 0),
        ("redis_max_connections", 0),
    ],
)
def test_bad_values_name_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        StorageConfig(**{field: value})  # type: ignore[arg-type]


def test_config_is_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        StorageConfig().backend = "redis"  # type: ignore[misc]


async def test_open_stores_defaults_to_memory() -> None:
    async with open_stores(StorageConfig()) as stores:
        assert isinstance(stores, Stores)
        assert type(stores.responses).__module__ == "storage.memory"
