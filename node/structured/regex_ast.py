"""A typed syntax tree of the regular expressions an engine's constrained decoder accepts.

The gateway parses a request's regex (``structured_outputs.regex``, a schema's ``pattern``) once to refuse
what no decoder can apply, and the simulated engine samples strings from the same tree. Python's own parser
(``re._parser``) does the parsing; its untyped tuples stop in this module.

Constrained decoders (xgrammar, llguidance, outlines) compile a regex to an automaton, so backreferences,
lookaround and conditional groups cannot be expressed: those raise ``RegexUnsupported``. Anchors (``^``,
``$``, ``\\A``, ``\\Z``) are accepted and mean nothing: a constrained output always matches as a whole.
"""

from __future__ import annotations

import importlib
import re
from dataclasses import dataclass
from typing import Any

_parser: Any = importlib.import_module("re._parser")  # no stub: typeshed ships only the deprecated sre_parse
_c: Any = importlib.import_module("re._constants")

# Python's MAXREPEAT: the upper bound of an open repeat ("a*", "a{2,}").
_OPEN = int(_c.MAXREPEAT)
# The code points a negated class or "." is sampled from: printable ASCII reads well in tests and demos.
PRINTABLE = ((0x20, 0x7E),)
_DIGIT = ((0x30, 0x39),)
_WORD = ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A))
_SPACE = ((0x09, 0x0D), (0x20, 0x20))


class RegexUnsupported(ValueError):
    """The pattern is not a regex, or uses a construct a constrained decoder cannot apply."""


@dataclass(frozen=True, slots=True)
class CharSet:
    """One character from ``ranges`` (inclusive code point pairs), or, when ``negated``, one not in them."""

    ranges: tuple[tuple[int, int], ...]
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Alt:
    options: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class Repeat:
    """``item`` between ``low`` and ``high`` times; ``high`` None: unbounded."""

    item: Node
    low: int
    high: int | None


Node = CharSet | Seq | Alt | Repeat


def parse_regex(pattern: str) -> Node:
    """The tree of ``pattern``.

    Raises:
        RegexUnsupported: the pattern does not parse, or uses backreferences, lookaround or conditionals.
    """
    try:
        parsed = _parser.parse(pattern)
    except (re.error, RecursionError, OverflowError) as exc:
        raise RegexUnsupported(f"not a valid regular expression: {exc}") from exc
    return _seq(parsed)


def _seq(items: Any) -> Node:
    nodes = tuple(n for n in (_node(op, av) for op, av in items) if n is not None)
    return nodes[0] if len(nodes) == 1 else Seq(nodes)


def _category(cat: Any) -> CharSet:
    name = str(cat)
    negated = name.startswith("CATEGORY_NOT_")
    base = name.removeprefix("CATEGORY_NOT_").removeprefix("CATEGORY_")
    table = {"DIGIT": _DIGIT, "WORD": _WORD, "SPACE": _SPACE}
    if base not in table:
        raise RegexUnsupported(f"the character category {name} is not supported")
    return CharSet(table[base], negated)


def _char_class(items: Any) -> CharSet:
    negated = False
    ranges: list[tuple[int, int]] = []
    for op, av in items:
        if op is _c.NEGATE:
            negated = True
        elif op is _c.LITERAL:
            ranges.append((av, av))
        elif op is _c.RANGE:
            ranges.append((av[0], av[1]))
        elif op is _c.CATEGORY:
            inner = _category(av)
            if inner.negated:
                raise RegexUnsupported("a negated category (\\D, \\W, \\S) inside a character class is not supported")
            ranges.extend(inner.ranges)
        else:
            raise RegexUnsupported(f"the character class item {op} is not supported")
    return CharSet(tuple(ranges), negated)


def _node(op: Any, av: Any) -> Node | None:
    if op is _c.LITERAL:
        return CharSet(((av, av),))
    if op is _c.NOT_LITERAL:
        return CharSet(((av, av),), negated=True)
    if op is _c.ANY:
        return CharSet(((0x0A, 0x0A),), negated=True)
    if op is _c.IN:
        return _char_class(av)
    if op is _c.CATEGORY:
        return _category(av)
    if op is _c.BRANCH:
        return Alt(tuple(_seq(option) for option in av[1]))
    if op is _c.SUBPATTERN:
        return _seq(av[-1])
    if op in (_c.MAX_REPEAT, _c.MIN_REPEAT, _c.POSSESSIVE_REPEAT):
        low, high, item = av
        return Repeat(_seq(item), int(low), None if high == _OPEN else int(high))
    if op is _c.AT:
        return None
    if op is _c.ATOMIC_GROUP:
        return _seq(av)
    names = {
        "GROUPREF": "backreferences",
        "GROUPREF_EXISTS": "conditional groups",
        "ASSERT": "lookahead/lookbehind",
        "ASSERT_NOT": "negative lookahead/lookbehind",
    }
    raise RegexUnsupported(f"{names.get(str(op), str(op))} cannot be enforced by a constrained decoder")
