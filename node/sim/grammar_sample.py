"""Random strings of a small EBNF (GBNF) grammar, for the simulated engine's answer under a grammar constraint.

The subset read: rules ``name ::= alternatives`` (a rule starts at a line whose first token is a name
followed by ``::=``), with alternatives split by ``|``, and elements: double-quoted literals (``\\"``,
``\\\\``, ``\\n``, ``\\t`` escapes), character classes ``[...]``, rule names, parenthesised groups and the
postfix operators ``*``, ``+``, ``?``; ``#`` comments. The start rule is ``root``. Anything else (Lark
grammars, ``{m,n}`` repeats, xgrammar's extensions) raises ``GrammarUnsupported`` and the simulator writes
prose instead; the real engine is what judges a grammar.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass

from node.sim.regex_sample import OPEN_REPEAT_EXTRA, sample_node
from node.structured.regex_ast import CharSet, RegexUnsupported, parse_regex

# Rule expansions deep: a recursive grammar is cut off here (GrammarUnsupported) rather than looping.
MAX_DEPTH = 64
_TOKEN = re.compile(
    r"""\s*(?:(?P<lit>"(?:[^"\\]|\\.)*")|(?P<cls>\[(?:[^\]\\]|\\.)*\])|(?P<name>[A-Za-z_][\w-]*)"""
    r"""|(?P<op>::=|[|()*+?])|(?P<comment>\#[^\n]*))""",
    re.DOTALL,
)
_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "\\": "\\"}


class GrammarUnsupported(ValueError):
    """The grammar is outside the subset this sampler reads, or too deeply recursive to sample."""


@dataclass(frozen=True, slots=True)
class _Lit:
    text: str


@dataclass(frozen=True, slots=True)
class _Class:
    charset: CharSet


@dataclass(frozen=True, slots=True)
class _Ref:
    name: str


@dataclass(frozen=True, slots=True)
class _Alt:
    options: tuple[tuple[_Expr, ...], ...]


@dataclass(frozen=True, slots=True)
class _Rep:
    item: _Expr
    low: int
    high: int | None


_Expr = _Lit | _Class | _Ref | _Alt | _Rep


def sample_grammar(grammar: str, rng: random.Random) -> str:
    """A string of the language of ``grammar`` from its ``root`` rule. Raises GrammarUnsupported."""
    rules = _parse(grammar)
    if "root" not in rules:
        raise GrammarUnsupported("the grammar has no root rule")
    out: list[str] = []
    _sample(rules["root"], rules, rng, out, 0)
    return "".join(out)


def _tokens(grammar: str) -> list[tuple[str, str]]:
    text = grammar
    tokens: list[tuple[str, str]] = []
    pos = 0
    while pos < len(text):
        if text[pos:].strip() == "":
            break
        match = _TOKEN.match(text, pos)
        if match is None:
            raise GrammarUnsupported(f"unexpected text at offset {pos}: {text[pos : pos + 20]!r}")
        kind = match.lastgroup or ""
        if kind != "comment":
            tokens.append((kind, match.group(kind)))
        pos = match.end()
    return tokens


def _parse(grammar: str) -> dict[str, _Expr]:
    tokens = _tokens(grammar)
    rules: dict[str, _Expr] = {}
    i = 0
    while i < len(tokens):
        if i + 1 >= len(tokens) or tokens[i][0] != "name" or tokens[i + 1] != ("op", "::="):
            raise GrammarUnsupported("expected 'name ::= ...'")
        name = tokens[i][1]
        j = i + 2
        while j < len(tokens) and not (
            j + 1 < len(tokens) and tokens[j][0] == "name" and tokens[j + 1] == ("op", "::=")
        ):
            j += 1
        expr, rest = _alternatives(tokens[i + 2 : j])
        if rest:
            raise GrammarUnsupported(f"unbalanced parentheses in rule {name!r}")
        rules[name] = expr
        i = j
    return rules


def _alternatives(tokens: list[tuple[str, str]]) -> tuple[_Expr, list[tuple[str, str]]]:
    options: list[tuple[_Expr, ...]] = []
    sequence: list[_Expr] = []
    while tokens:
        kind, value = tokens[0]
        if (kind, value) == ("op", ")"):
            break
        tokens = tokens[1:]
        if (kind, value) == ("op", "|"):
            options.append(tuple(sequence))
            sequence = []
            continue
        item: _Expr
        if kind == "lit":
            item = _Lit(_unescape(value[1:-1]))
        elif kind == "cls":
            try:
                node = parse_regex(value)
            except RegexUnsupported as exc:
                raise GrammarUnsupported(str(exc)) from exc
            if not isinstance(node, CharSet):
                raise GrammarUnsupported(f"{value} is not a character class")
            item = _Class(node)
        elif kind == "name":
            item = _Ref(value)
        elif (kind, value) == ("op", "("):
            inner, tokens = _alternatives(tokens)
            if not tokens or tokens[0] != ("op", ")"):
                raise GrammarUnsupported("unbalanced parentheses")
            tokens = tokens[1:]
            item = inner
        else:
            raise GrammarUnsupported(f"unexpected {value!r}")
        while tokens and tokens[0][0] == "op" and tokens[0][1] in "*+?":
            op = tokens[0][1]
            item = _Rep(item, 1 if op == "+" else 0, 1 if op == "?" else None)
            tokens = tokens[1:]
        sequence.append(item)
    options.append(tuple(sequence))
    return _Alt(tuple(options)), tokens


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: _ESCAPES.get(m.group(1), m.group(1)), text)


def _sample(expr: _Expr, rules: dict[str, _Expr], rng: random.Random, out: list[str], depth: int) -> None:
    if depth > MAX_DEPTH:
        raise GrammarUnsupported(f"the grammar recurses deeper than {MAX_DEPTH} levels")
    if isinstance(expr, _Lit):
        out.append(expr.text)
    elif isinstance(expr, _Class):
        out.append(sample_node(expr.charset, rng))
    elif isinstance(expr, _Ref):
        if expr.name not in rules:
            raise GrammarUnsupported(f"the rule {expr.name!r} is not defined")
        _sample(rules[expr.name], rules, rng, out, depth + 1)
    elif isinstance(expr, _Alt):
        for item in rng.choice(expr.options):
            _sample(item, rules, rng, out, depth + 1)
    else:
        extra = OPEN_REPEAT_EXTRA if expr.high is None else expr.high - expr.low
        for _ in range(expr.low + rng.randint(0, extra)):
            _sample(expr.item, rules, rng, out, depth + 1)
