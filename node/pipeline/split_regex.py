"""One tiktoken split regex equivalent to a chain of Hugging Face ``Split`` pre-tokenizers.

tiktoken applies a single regex and encodes only its matches; Hugging Face applies each ``Split`` (behavior
``Isolated``) to the pieces the previous one produced and keeps unmatched gaps as pieces too. The chain
``R1, ..., Rk`` is expressible as one regex when every split but the last isolates runs of one character
class ``C`` (``C+`` or ``C{1,n}``, e.g. DeepSeek's ``\\p{N}{1,3}`` and its CJK run): those pieces then start
exactly at ``C`` characters and never contain another class's characters. The equivalent regex is

    R1 | R2∖C1 | ... | Rk∖(C1 ∪ ... ∪ Ck-1) | catch-all

where ``R∖B`` restricts every character-consuming atom of ``R`` (lookarounds included) to ``[^B]``: a
match then never crosses a piece boundary, and a lookahead at a boundary sees what it would see at the
end of the piece (nothing it can match). The catch-all consumes what the last split leaves unmatched
(Hugging Face keeps those gaps; tiktoken would drop them).

The alternatives are written with every run of lookaround-free branches in one group,
``(?:'s|...| ?[^\\s\\p{L}\\p{N}]+)|\\s+(?!\\S)|\\s+|catch-all``: the same regex (alternation is associative under
leftmost-first priority, so every match is the same), but fancy_regex, which runs an alternation holding a
lookaround in its backtracking VM and tries each branch there in turn, hands a group without one to
regex-automata's DFA as a single search: 7,800 tokens of Qwen encode in 12-37 % less time on prose, code,
Latin-script and JSON text (4 % on CJK), most of what removing the lookahead altogether would save.

The parser accepts the Oniguruma subset these patterns use and rejects anything whose meaning differs
between Oniguruma and Rust's ``regex``/``fancy_regex`` (anchors, backreferences, POSIX brackets, the
``m``/``s``/``x`` flags, class operators ``--``/``~~``) or that can match the empty string, so a pattern
it returns has the same meaning under both engines (up to Unicode-table versions, which the load-time
corpus check and the property tests compare).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from itertools import groupby
from operator import attrgetter
from typing import Final

# GPT-2's split regex, applied by a ByteLevel pre-tokenizer with use_regex=True.
GPT2_PATTERN: Final = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"

# \d and \w are left out: Oniguruma and Rust disagree on whether they are ASCII-only in some syntaxes.
_CLASS_SHORTHANDS: Final = frozenset("sS")
_CONTROL_ESCAPES: Final = {"t": 0x09, "n": 0x0A, "v": 0x0B, "f": 0x0C, "r": 0x0D, "a": 0x07, "e": 0x1B}
_QUANTIFIER = re.compile(r"\{(\d*)(?:(,)(\d*))?\}")


class UnsupportedPattern(ValueError):
    """The pattern uses a construct this module cannot translate faithfully."""


@dataclass(frozen=True, slots=True)
class _Node:
    text: str  # the translated regex text
    nullable: bool  # can match the empty string
    atom: str | None = None  # set on a single character-consuming atom: its class, untranslated
    run: str | None = None  # set on ``atom+`` / ``atom{1,n}``: the class whose runs it isolates
    zero_width: bool = False  # a lookaround
    lookaround: bool = False  # a lookaround anywhere inside
    branches: tuple[_Node, ...] = ()  # an alternation's branches (empty for anything else)
    scoped_flag: bool = False  # a bare ``(?i)``, which reaches the end of its enclosing group


class _Parser:
    """Recursive descent over one pattern; ``excluded`` is the class union B of ``R∖B`` ('' for none)."""

    def __init__(self, pattern: str, excluded: str) -> None:
        self._src = pattern
        self._pos = 0
        self._excluded = excluded

    def parse(self) -> _Node:
        node = self._alternation()
        if self._pos != len(self._src):
            raise UnsupportedPattern(f"unbalanced ')' at {self._pos}")
        return node

    def _peek(self, k: int = 0) -> str:
        i = self._pos + k
        return self._src[i] if i < len(self._src) else ""

    def _alternation(self) -> _Node:
        branches = [self._sequence()]
        while self._peek() == "|":
            self._pos += 1
            branches.append(self._sequence())
        if len(branches) == 1:
            return branches[0]
        return _Node(
            "|".join(b.text for b in branches),
            any(b.nullable for b in branches),
            lookaround=any(b.lookaround for b in branches),
            branches=tuple(branches),
            scoped_flag=any(b.scoped_flag for b in branches),
        )

    def _sequence(self) -> _Node:
        items: list[_Node] = []
        while self._peek() not in ("", "|", ")"):
            items.append(self._quantified())
        if len(items) == 1:
            return items[0]
        return _Node(
            "".join(i.text for i in items),
            all(i.nullable for i in items),
            lookaround=any(i.lookaround for i in items),
            scoped_flag=any(i.scoped_flag for i in items),
        )

    def _quantified(self) -> _Node:
        atom = self._atom()
        c = self._peek()
        if c in ("*", "+", "?"):
            self._pos += 1
            quant, low = c, (1 if c == "+" else 0)
        elif c == "{" and (m := _QUANTIFIER.match(self._src, self._pos)):
            low_s, comma, high_s = m.groups()
            if not low_s and not comma:
                raise UnsupportedPattern("empty quantifier")
            low = int(low_s or 0)
            # Oniguruma's {,n} is {0,n}; Rust's regex rejects the short form.
            quant = "{" + str(low) + ((comma + high_s) if comma else "") + "}"
            self._pos = m.end()
        else:
            return atom
        if self._peek() == "+":
            raise UnsupportedPattern("possessive quantifier")
        if self._peek() == "?":  # lazy: same meaning in both engines
            self._pos += 1
            quant += "?"
        if atom.zero_width:
            raise UnsupportedPattern("quantified lookaround")
        return _Node(
            atom.text + quant,
            atom.nullable or low == 0,
            run=atom.atom if low == 1 else None,
            lookaround=atom.lookaround,
        )

    def _atom(self) -> _Node:
        c = self._peek()
        if c == "(":
            return self._group()
        if c == "[":
            return self._consuming(self._bracket())
        if c == "\\":
            return self._escape()
        if c in ("^", "$"):
            raise UnsupportedPattern(f"anchor {c!r}")
        if c in ("*", "+", "?", "{"):
            if c == "{" and not _QUANTIFIER.match(self._src, self._pos):
                self._pos += 1  # Oniguruma reads a '{' that starts no quantifier as a literal
                return self._consuming(r"\{")
            raise UnsupportedPattern(f"nothing to repeat at {self._pos}")
        self._pos += 1
        if c == ".":
            return self._consuming(r"[^\n]")
        return self._consuming(_literal(c))

    def _consuming(self, atom: str) -> _Node:
        text = f"[{atom}&&[^{self._excluded}]]" if self._excluded else atom
        return _Node(text, nullable=False, atom=atom)

    def _group(self) -> _Node:
        start = self._pos
        self._pos += 1
        if self._peek() != "?":
            prefix, zero_width = "(?:", False  # capture groups do not matter to find_iter
        else:
            for opener in ("?:", "?=", "?!", "?<=", "?<!", "?>"):
                if self._src.startswith(opener, self._pos):
                    prefix, zero_width = "(" + opener, opener not in ("?:", "?>")
                    self._pos += len(opener)
                    break
            else:
                m = re.compile(r"\?(-?i+)(:|\))").match(self._src, self._pos)
                if not m:
                    raise UnsupportedPattern(f"group syntax at {start}")
                self._pos = m.end()
                if m.group(2) == ")":  # (?i) applies to the rest of the enclosing group: same in both
                    return _Node(f"(?{m.group(1)})", nullable=True, scoped_flag=True)
                prefix, zero_width = f"(?{m.group(1)}:", False
        inner = self._alternation()
        if self._peek() != ")":
            raise UnsupportedPattern(f"unclosed group at {start}")
        self._pos += 1
        return _Node(
            prefix + inner.text + ")",
            zero_width or inner.nullable,
            zero_width=zero_width,
            lookaround=zero_width or inner.lookaround,
        )

    def _escape(self) -> _Node:
        c = self._peek(1)
        if c in ("p", "P"):
            m = re.compile(r"\\[pP](\{[A-Za-z_ =]+\}|[A-Za-z])").match(self._src, self._pos)
            if not m:
                raise UnsupportedPattern(f"bad property escape at {self._pos}")
            self._pos = m.end()
            return self._consuming(m.group(0))
        self._pos += 2
        if c in _CLASS_SHORTHANDS:
            return self._consuming("\\" + c)
        return self._consuming(_literal(self._escaped_char(c)))

    def _escaped_char(self, c: str) -> str:
        if c in _CONTROL_ESCAPES:
            return chr(_CONTROL_ESCAPES[c])
        if c == "x":
            m = re.compile(r"\{([0-9A-Fa-f]{1,6})\}|([0-9A-Fa-f]{2})").match(self._src, self._pos)
            if not m:
                raise UnsupportedPattern("bad \\x escape")
            self._pos = m.end()
            return chr(int(m.group(1) or m.group(2), 16))
        if c == "u":
            m = re.compile(r"[0-9A-Fa-f]{4}").match(self._src, self._pos)
            if not m:
                raise UnsupportedPattern("bad \\u escape")
            self._pos = m.end()
            return chr(int(m.group(0), 16))
        if c and not c.isalnum():
            return c  # an escaped metacharacter or punctuation: itself
        raise UnsupportedPattern(f"escape \\{c}")

    def _bracket(self) -> str:
        """A bracket expression, returned in Rust syntax (nested classes and '&&' kept)."""
        start = self._pos
        out = ["["]
        self._pos += 1
        if self._peek() == "^":
            out.append("^")
            self._pos += 1
        if self._peek() == "]":
            raise UnsupportedPattern("']' first in a class")
        while True:
            c = self._peek()
            if c == "":
                raise UnsupportedPattern(f"unclosed class at {start}")
            if c == "]":
                self._pos += 1
                out.append("]")
                return "".join(out)
            if c == "[":
                if self._peek(1) == ":":
                    raise UnsupportedPattern("POSIX bracket")
                out.append(self._bracket())
            elif c == "\\":
                n = self._peek(1)
                if n in ("p", "P"):
                    m = re.compile(r"\\[pP](\{[A-Za-z_ =]+\}|[A-Za-z])").match(self._src, self._pos)
                    if not m:
                        raise UnsupportedPattern("bad property escape")
                    out.append(m.group(0))
                    self._pos = m.end()
                elif n in _CLASS_SHORTHANDS:
                    out.append("\\" + n)
                    self._pos += 2
                else:
                    self._pos += 2
                    out.append(_literal(self._escaped_char(n)))
            elif c in ("-", "~") and self._peek(1) == c:
                raise UnsupportedPattern(f"class operator {c * 2!r}")
            elif c == "&" and self._peek(1) == "&":
                out.append("&&")
                self._pos += 2
            else:
                out.append(c if c == "-" else _literal(c))
                self._pos += 1


def _literal(c: str) -> str:
    """``c`` as a regex atom valid inside and outside a class: metacharacters become ``\\x{..}``."""
    return c if c.isalnum() or c in " _'\"" else f"\\x{{{ord(c):X}}}"


def restrict(pattern: str, excluded: str = "") -> str:
    """``pattern`` translated to Rust regex syntax, every consuming atom restricted to ``[^excluded]``.

    Raises:
        UnsupportedPattern: a construct without a faithful translation, or the pattern matches "".
    """
    return _restricted(pattern, excluded).text


def _restricted(pattern: str, excluded: str) -> _Node:
    node = _Parser(pattern, excluded).parse()
    if node.nullable:
        raise UnsupportedPattern("pattern can match the empty string")
    return node


def class_run(pattern: str) -> str | None:
    """The class ``C`` if ``pattern`` is exactly ``C+`` or ``C{1,n}`` for one consuming atom, else None."""
    try:
        return _Parser(pattern, "").parse().run
    except UnsupportedPattern:
        return None


def compose(patterns: Sequence[str], *, grouped: bool = True) -> str:
    """One find_iter regex equivalent to applying the ``Isolated`` splits ``patterns`` in order
    (``grouped=False``: every branch at the top level, the same regex written flat, for reference).

    Raises:
        UnsupportedPattern: a split before the last is not a class run, or a pattern is untranslatable.
    """
    if not patterns:
        raise UnsupportedPattern("no split pattern")
    branches: list[_Node] = []
    excluded = ""
    last = ""
    for i, pattern in enumerate(patterns):
        node = _restricted(pattern, excluded)
        if node.scoped_flag:  # kept whole in its own group, so the flag's reach stays what it was
            branches.append(_Node(f"(?:{node.text})", nullable=False, lookaround=node.lookaround))
        else:
            branches.extend(node.branches or (node,))
        last = node.text
        if i < len(patterns) - 1:
            run = class_run(pattern)
            if run is None:
                raise UnsupportedPattern(f"split {i} is not a run of one character class: {pattern!r}")
            excluded += run
    anything = f"[^{excluded}]" if excluded else r"[\s\S]"
    # Hugging Face keeps the text the last split leaves unmatched as pieces; tiktoken would drop it.
    branches.append(_Node(f"(?:(?!{last}){anything})+", nullable=False, lookaround=True))
    return _grouped(branches) if grouped else "|".join(b.text for b in branches)


def _grouped(branches: Sequence[_Node]) -> str:
    """``branches`` as one alternation, each run of lookaround-free branches in one group (module docstring)."""
    parts: list[str] = []
    for has_lookaround, run in groupby(branches, key=attrgetter("lookaround")):
        texts = [branch.text for branch in run]
        if has_lookaround or len(texts) == 1:
            parts += texts
        else:
            parts.append(f"(?:{'|'.join(texts)})")
    return "|".join(parts)
