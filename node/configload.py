"""Typed configuration loading: one frozen dataclass per component, filled from YAML, env and CLI flags.

Defaults live only in the dataclass fields. Each field becomes a CLI flag (``--field-name``, or
``metadata["flag"]``), an environment variable (``SMG_NODE_FIELD_NAME``, or the class's own ``ENV_PREFIX`` when
a command's config must not answer to another command's variables) and a YAML key (the field name) in its
component's section (``http: {port: 8000}``) or, equally, at the top level (``port: 8000``).
Precedence, lowest to highest: field default < YAML file < environment < CLI flag. Values are validated once,
here, and a bad key or value is reported by name (``ConfigError``).
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

ENV_PREFIX = "SMG_NODE_"
_MISSING = dataclasses.MISSING

T = TypeVar("T")


class ConfigError(ValueError):
    """A configuration key or value is invalid; the message names the key."""


def flag_name(field: dataclasses.Field[Any]) -> str:
    flag = field.metadata.get("flag")
    return str(flag) if flag else "--" + field.name.replace("_", "-")


def env_prefix(cls: type[Any]) -> str:
    """The class's ``ENV_PREFIX`` (a ClassVar) if it sets one, else SMG_NODE_."""
    return str(getattr(cls, "ENV_PREFIX", ENV_PREFIX))


def env_name(field: dataclasses.Field[Any], prefix: str = ENV_PREFIX) -> str:
    return prefix + field.name.upper()


def _fields(cls: type[Any]) -> tuple[dataclasses.Field[Any], ...]:
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls!r} is not a dataclass")
    return dataclasses.fields(cls)


def _hints(cls: type[Any]) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _is_seq(tp: Any) -> bool:
    return get_origin(tp) in (tuple, list, Sequence)


def _strip_optional(tp: Any) -> tuple[Any, bool]:
    if get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in get_args(tp) if a is not type(None)]
        if len(args) == 1 and len(get_args(tp)) == 2:
            return args[0], True
    return tp, False


def convert(key: str, tp: Any, raw: Any) -> Any:
    """Convert a raw value (str from env/CLI, a YAML scalar/list) to ``tp``; raises ConfigError naming key."""
    inner, optional = _strip_optional(tp)
    if raw is None:
        if optional:
            return None
        raise ConfigError(f"{key}: a value is required")
    if optional and isinstance(raw, str) and raw == "":
        return None
    if _is_seq(inner):
        (item_tp, *_rest) = get_args(inner) or (str,)
        items: list[Any]
        if isinstance(raw, str):
            items = [s.strip() for s in raw.split(",") if s.strip()]
        elif isinstance(raw, list | tuple):
            items = list(raw)
        else:
            raise ConfigError(f"{key}: expected a list, got {raw!r}")
        return tuple(convert(key, item_tp, item) for item in items)
    if get_origin(inner) is Literal:
        choices = get_args(inner)
        if raw not in choices:
            raise ConfigError(f"{key}: {raw!r} is not one of {', '.join(map(str, choices))}")
        return raw
    if inner is bool:
        if isinstance(raw, bool):
            return raw
        text = str(raw).strip().lower()
        if text in ("1", "true", "yes", "on"):
            return True
        if text in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected a boolean, got {raw!r}")
    if inner is int:
        if isinstance(raw, bool):
            raise ConfigError(f"{key}: expected an integer, got {raw!r}")
        try:
            return int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected an integer, got {raw!r}") from None
    if inner is float:
        if isinstance(raw, bool):
            raise ConfigError(f"{key}: expected a number, got {raw!r}")
        try:
            return float(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected a number, got {raw!r}") from None
    if inner is str:
        if isinstance(raw, dict | list):
            raise ConfigError(f"{key}: expected a string, got {raw!r}")
        return str(raw)
    if inner is Path:
        return Path(str(raw))
    raise ConfigError(f"{key}: unsupported config type {inner!r}")


def add_arguments(
    parser: argparse.ArgumentParser,
    cls: type[Any],
    *,
    group: str | None = None,
    description: str | None = None,
    only: Sequence[str] | None = None,
) -> None:
    """Add one flag per field of ``cls`` (or of the fields named in ``only``), under the help title ``group``
    (with ``description`` below it). Flags default to None so that 'not given' is distinguishable."""
    target: Any = parser.add_argument_group(group, description) if group else parser
    hints = _hints(cls)
    for field in _fields(cls):
        if field.metadata.get("cli") is False or (only is not None and field.name not in only):
            continue
        tp = hints[field.name]
        default = field.default if field.default is not _MISSING else None
        if field.default_factory is not _MISSING:
            default = field.default_factory()
        help_text = str(field.metadata.get("help", ""))
        env = env_name(field, env_prefix(cls))
        inner, _ = _strip_optional(tp)
        dest = f"{cls.__name__}.{field.name}"
        if inner is bool:
            target.add_argument(
                flag_name(field),
                dest=dest,
                action=argparse.BooleanOptionalAction,
                default=None,
                help=f"{help_text} [default: {default}; env {env}]",
            )
        elif _is_seq(inner):
            target.add_argument(
                flag_name(field),
                dest=dest,
                action="append",
                default=None,
                metavar=field.metadata.get("metavar", field.name.upper().rstrip("S")),
                help=f"{help_text} (repeatable) [env {env}, comma-separated]",
            )
        else:
            choices = get_args(inner) if get_origin(inner) is Literal else None
            target.add_argument(
                flag_name(field),
                dest=dest,
                default=None,
                choices=choices,
                metavar=None if choices else field.metadata.get("metavar", field.name.upper()),
                help=f"{help_text} [default: {default!r}; env {env}]",
            )


def read_yaml(path: Path) -> dict[str, Any]:
    """Read a YAML config file: a mapping of sections and/or field names (see ``split_sections``)."""
    import yaml  # only with --config

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise ConfigError(f"config file {path}: {exc.strerror or exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path}: not valid YAML: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: expected a mapping at the top level")
    return {str(key): value for key, value in data.items()}


def split_sections(data: Mapping[str, Any], sections: Mapping[str, type[Any]]) -> dict[str, dict[str, Any]]:
    """Each section's values of a config file, keyed by section name.

    A top-level key naming a section and holding a mapping is that section (``http: {port: 8000}``); any
    other top-level key is a field name, given to the component that owns it (``port: 8000``). The two
    never clash: no config field holds a mapping, so ``workers: [grpc://a:1]`` is WorkerPoolConfig's field
    and ``workers: {health_interval_s: 1}`` its section.

    Raises ConfigError naming an unknown key (``section.key`` inside a section), an unknown section, or a
    field given both in its section and at the top level.
    """
    owner = {field.name: name for name, cls in sections.items() for field in _fields(cls)}
    out: dict[str, dict[str, Any]] = {name: {} for name in sections}
    where: dict[tuple[str, str], str] = {}
    unknown: list[str] = []

    def put(section: str, key: str, value: Any, spelled: str) -> None:
        if (section, key) in where:
            raise ConfigError(f"{spelled}: also given as {where[section, key]}")
        where[section, key] = spelled
        out[section][key] = value

    for key, value in data.items():
        if isinstance(value, dict):
            if key not in sections:
                known = ", ".join(sections)
                raise ConfigError(f"unknown config section {key!r} (sections: {known})")
            fields = {field.name for field in _fields(sections[key])}
            for inner, inner_value in value.items():
                spelled = f"{key}.{inner}"
                if inner not in fields:
                    unknown.append(spelled)
                else:
                    put(key, str(inner), inner_value, spelled)
        elif key in owner:
            put(owner[key], key, value, key)
        else:
            unknown.append(key)
    if unknown:
        raise ConfigError(f"unknown config key(s): {', '.join(sorted(unknown))}")
    return out


def build(
    cls: type[T],
    *,
    args: argparse.Namespace | None = None,
    env: Mapping[str, str] | None = None,
    file_values: Mapping[str, Any] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> T:
    """Build ``cls`` from (lowest to highest) defaults, file values, env, CLI args, explicit overrides."""
    hints = _hints(cls)
    prefix = env_prefix(cls)
    values: dict[str, Any] = {}
    for field in _fields(cls):
        tp = hints[field.name]
        if file_values is not None and field.name in file_values:
            values[field.name] = convert(field.name, tp, file_values[field.name])
        var = env_name(field, prefix)
        if env is not None and var in env:
            values[field.name] = convert(var, tp, env[var])
        if args is not None:
            raw = getattr(args, f"{cls.__name__}.{field.name}", None)
            if raw is not None:
                if isinstance(raw, list) and _is_seq(_strip_optional(tp)[0]):
                    raw = [part for item in raw for part in str(item).split(",") if part]
                values[field.name] = convert(flag_name(field), tp, raw)
        if overrides is not None and field.name in overrides:
            values[field.name] = overrides[field.name]
    try:
        return cls(**values)
    except (TypeError, ValueError) as exc:
        raise ConfigError(str(exc)) from exc


def load_sections(
    sections: Mapping[str, type[Any]],
    *,
    args: argparse.Namespace | None,
    env: Mapping[str, str] | None,
    path: Path | None = None,
    overrides: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Build every section's config from (lowest to highest) defaults, the YAML file at ``path``, env, CLI
    args and ``overrides`` (section -> field -> value). Raises ConfigError naming the bad key or value."""
    file_values = split_sections(read_yaml(path), sections) if path is not None else {}
    return {
        name: build(
            cls,
            args=args,
            env=env,
            file_values=file_values.get(name),
            overrides=(overrides or {}).get(name),
        )
        for name, cls in sections.items()
    }
