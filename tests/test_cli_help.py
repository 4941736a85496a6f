"""`--help` reads as an operator's manual: every option under a titled group (what the options are for, never a
class name or argparse's anonymous "options"), every line saying its default."""

from __future__ import annotations

import re

import pytest

from node.cli import main
from node.config import NODE_SECTIONS

# A group title that is an identifier: a class name (HttpConfig), a section key (tokenizer_cache), argparse's own.
_IDENTIFIER = re.compile(r"([A-Z][a-z0-9]+){2,}|[a-z0-9_]+|options|optional arguments|positional arguments")


def _help(command: str, capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as exit_info:
        main([command, "--help"])
    assert exit_info.value.code == 0
    return capsys.readouterr().out


def _options_by_group(text: str) -> dict[str, tuple[str, str]]:
    """Each option of a --help text -> (the title of the group it is listed under, its help text)."""
    body = text.split("\n\n", 1)[1]  # after the usage lines
    out: dict[str, tuple[str, str]] = {}
    group = ""
    option = ""
    for line in body.splitlines():
        if line and not line.startswith(" "):
            group, option = line.removesuffix(":"), ""
        elif line.startswith("  -"):
            # "  -h, --help   text", "  --host HOST   text", "  --reuse-port, --no-reuse-port": named by its first
            # long flag; the help starts after two spaces (or on the next line).
            invocation, _, help_text = line.strip().partition("  ")
            option = next(f for f in re.findall(r"-[-\w]+", invocation) if f.startswith("--"))
            out[option] = (group, help_text.strip())
        elif option and line.strip():
            out[option] = (group, f"{out[option][1]} {line.strip()}")
    return out


@pytest.mark.parametrize("command", ["serve", "sim-worker", "demo"])
def test_every_option_sits_in_a_group_titled_for_people(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    options = _options_by_group(_help(command, capsys))
    assert "--help" in options and "--config" in options
    class_names = {cls.__name__ for cls in NODE_SECTIONS.values()}
    for option, (group, help_text) in options.items():
        assert group, option
        assert not _IDENTIFIER.fullmatch(group), f"{option} is under {group!r}"
        assert not any(name in group for name in class_names), f"{option} is under {group!r}"
        # What it does, and its default (a repeatable option's default is none; --help has none).
        assert len(help_text.split()) >= 3, f"{option}: {help_text!r}"
        if option != "--help":
            assert "default" in help_text or "repeatable" in help_text, f"{option}: {help_text!r}"


def test_serve_help_lists_every_config_field(capsys: pytest.CaptureFixture[str]) -> None:
    """Grouping leaves no flag out: one option per config field (bar those the CLI does not offer)."""
    import dataclasses

    from node.configload import flag_name

    options = _options_by_group(_help("serve", capsys))
    expected = {
        flag_name(f)
        for cls in NODE_SECTIONS.values()
        for f in dataclasses.fields(cls)  # type: ignore[arg-type]
        if f.metadata.get("cli") is not False
    }
    assert expected <= set(options)
    groups = {group for group, _ in options.values()}
    for title in ("Listening, connections and TLS", "Mesh: the cluster of nodes", "Limits on requests"):
        assert title in groups
