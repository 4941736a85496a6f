"""Random strings matching a regex, for the simulated engine's answer under a regex constraint.

Pure: the tree comes from ``node.structured.regex_ast`` (the constructs a constrained decoder accepts), the
randomness from the caller's ``random.Random``. Every construct of that tree is sampled exactly, except that
an unbounded repeat (``*``, ``+``, ``{n,}``) stops at most ``OPEN_REPEAT_EXTRA`` past its minimum, and a
negated class or ``.`` draws from printable ASCII: the result always matches the whole pattern.
"""

from __future__ import annotations

import random

from node.structured.regex_ast import PRINTABLE, Alt, CharSet, Node, Repeat, Seq, parse_regex

# How far past its minimum an unbounded repeat may run: a few characters read like a real answer.
OPEN_REPEAT_EXTRA = 3
# Repeats of a bounded quantifier beyond its minimum: `{1,1000}` should not write a thousand characters.
MAX_REPEAT_EXTRA = 8


def sample_regex(pattern: str, rng: random.Random) -> str:
    """A string ``re.fullmatch(pattern, s)`` accepts.

    Raises:
        RegexUnsupported: the pattern is not one a constrained decoder could apply.
    """
    out: list[str] = []
    _sample(parse_regex(pattern), rng, out)
    return "".join(out)


def sample_node(node: Node, rng: random.Random) -> str:
    out: list[str] = []
    _sample(node, rng, out)
    return "".join(out)


def _sample(node: Node, rng: random.Random, out: list[str]) -> None:
    if isinstance(node, CharSet):
        out.append(_char(node, rng))
    elif isinstance(node, Seq):
        for item in node.items:
            _sample(item, rng, out)
    elif isinstance(node, Alt):
        _sample(rng.choice(node.options), rng, out)
    elif isinstance(node, Repeat):
        extra = OPEN_REPEAT_EXTRA if node.high is None else min(node.high - node.low, MAX_REPEAT_EXTRA)
        for _ in range(node.low + rng.randint(0, extra)):
            _sample(node.item, rng, out)


def _char(charset: CharSet, rng: random.Random) -> str:
    if not charset.negated:
        low, high = rng.choice(charset.ranges)
        return chr(rng.randint(low, high))
    allowed = [c for lo, hi in PRINTABLE for c in range(lo, hi + 1) if not any(a <= c <= b for a, b in charset.ranges)]
    return chr(rng.choice(allowed)) if allowed else "\u00e9"
