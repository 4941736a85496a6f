"""An incremental validator of a JSON object's text: which prefix of the text seen so far can still become a
JSON object (RFC 8259), so streamed tool-call arguments release only text that keeps them valid.

Sans-IO and chunk-blind: `JsonPrefix.feed` consumes characters one at a time in effect (runs of string
characters, whitespace and digits are skipped with a regex, the decisions are per character), so the prefix it
accepts and the state it reaches depend only on the concatenated text, never on how it was split.

State: a stack of open containers (``{`` / ``[``), the position in the grammar (expecting a key, a colon, a
value, a comma or closer), and inside tokens: a string (with escape and ``\\uXXXX`` progress), a number (the
JSON number grammar's states: a lone ``-`` or ``1.`` or ``1e`` is a prefix, and a delimiter after it is not
accepted), a literal (``true``/``false``/``null`` character by character). The first character must be ``{``;
the object's closing brace ends the text (`done`); anything after it is not consumed.
"""

from __future__ import annotations

import re
from typing import Final

# Nesting deeper than this is refused: no real call's arguments nest 128 levels, and a client's JSON parser
# (Python's recurses per level) must be able to read what is released.
MAX_DEPTH: Final = 128

_WS: Final = re.compile(r"[ \t\n\r]*")
_STRING_RUN: Final = re.compile(r'[^"\\\x00-\x1f]*')
_DIGITS: Final = re.compile(r"[0-9]*")
_HEX: Final = frozenset("0123456789abcdefABCDEF")
_LITERALS: Final = {"t": "rue", "f": "alse", "n": "ull"}

# Grammar positions. _KEY_OR_CLOSE: after "{"; _KEY: after "," in an object; _COLON: after a key;
# _VALUE: after ":" or "," in an array; _VALUE_OR_CLOSE: after "["; _AFTER: after a value.
_START, _KEY_OR_CLOSE, _KEY, _COLON, _VALUE, _VALUE_OR_CLOSE, _AFTER, _DONE = range(8)
# Tokens: inside a string (key or value), an escape, a \u escape, a number, a literal.
_STRING, _ESCAPE, _UNICODE, _NUMBER, _LITERAL = range(8, 13)
# Number states (what was last read): "-", "0", nonzero digits, ".", fraction digits, "e", exponent sign,
# exponent digits. A number may end in _ZERO, _INT, _FRAC or _EXP_DIGITS.
_MINUS, _ZERO, _INT, _DOT, _FRAC, _E, _E_SIGN, _E_DIGITS = range(8)
_NUMBER_ENDS: Final = frozenset({_ZERO, _INT, _FRAC, _E_DIGITS})


class JsonPrefix:
    """Feed text; `feed` says how much of it keeps the whole a JSON-object prefix."""

    __slots__ = ("_hex", "_key", "_literal", "_number", "_stack", "_state", "broken")

    def __init__(self) -> None:
        self._stack: list[str] = []  # the open containers' closers, "}" or "]"
        self._state = _START
        self._key = False  # the open string is an object key
        self._number = _MINUS
        self._literal = ""  # the rest of the literal being read
        self._hex = 0  # hex digits left in a \u escape
        self.broken = False  # a character was refused: the text is no JSON-object prefix past that point

    @property
    def done(self) -> bool:
        """The object has closed."""
        return self._state == _DONE

    def feed(self, text: str, start: int = 0, end: int | None = None) -> int:
        """Consume ``text[start:end]``; return where consumption stopped: ``end`` when all of it was accepted,
        else the index of the first character not accepted (the object closed before it, see `done`, or it
        breaks the JSON, see `broken`). Once stopped, later feeds consume nothing."""
        stop = len(text) if end is None else end
        pos = start
        if self.broken:
            return pos
        while pos < stop:
            state = self._state
            ch = text[pos]
            if state == _STRING:
                # The bulk of arguments: ordinary string characters, skipped in C.
                pos = _STRING_RUN.match(text, pos, stop).end()  # type: ignore[union-attr]
                if pos == stop:
                    return pos
                ch = text[pos]
                if ch == '"':
                    self._state = _COLON if self._key else _AFTER
                elif ch == "\\":
                    self._state = _ESCAPE
                else:  # a control character must be escaped
                    return self._break(pos)
                pos += 1
                continue
            if state == _ESCAPE:
                if ch == "u":
                    self._state, self._hex = _UNICODE, 4
                elif ch in '"\\/bfnrt':
                    self._state = _STRING
                else:
                    return self._break(pos)
                pos += 1
                continue
            if state == _UNICODE:
                if ch not in _HEX:
                    return self._break(pos)
                self._hex -= 1
                if not self._hex:
                    self._state = _STRING
                pos += 1
                continue
            if state == _NUMBER:
                if not self._number_char(ch):
                    if self._number not in _NUMBER_ENDS:
                        return self._break(pos)
                    self._state = _AFTER  # the delimiter is read in the value's context below
                    continue
                if self._number in (_INT, _FRAC, _E_DIGITS):
                    pos = _DIGITS.match(text, pos + 1, stop).end()  # type: ignore[union-attr]
                else:
                    pos += 1
                continue
            if state == _LITERAL:
                if ch != self._literal[0]:
                    return self._break(pos)
                self._literal = self._literal[1:]
                if not self._literal:
                    self._state = _AFTER
                pos += 1
                continue
            if state == _DONE:
                return pos
            if ch in " \t\n\r":
                if state == _START:
                    return self._break(pos)
                pos = _WS.match(text, pos, stop).end()  # type: ignore[union-attr]
                continue
            if not self._structural(ch):
                return self._break(pos)
            pos += 1
        return pos

    def completion(self) -> str:
        """A text that, appended to what was accepted, makes a complete JSON object (the witness that the
        accepted text is a prefix of one). Raises ValueError when broken."""
        if self.broken:
            raise ValueError("broken")
        state, tail = self._state, ""
        if state == _START:
            return "{}"
        if state == _DONE:
            return ""
        if state in (_STRING, _ESCAPE, _UNICODE):
            tail = {_ESCAPE: "n", _UNICODE: "0" * self._hex}.get(state, "") + '"'
            state = _COLON if self._key else _AFTER
        elif state == _NUMBER:
            tail = "" if self._number in _NUMBER_ENDS else "1"  # "-1", "1.1", "1e1", "1e+1"
            state = _AFTER
        elif state == _LITERAL:
            tail, state = self._literal, _AFTER
        if state == _KEY:
            tail += '"k": 0'
        elif state == _COLON:
            tail += ": 0"
        elif state == _VALUE:
            tail += "0"
        return tail + "".join(reversed(self._stack))

    def _break(self, pos: int) -> int:
        self.broken = True
        return pos

    def _number_char(self, ch: str) -> bool:
        """Advance the number by ``ch``; False if ``ch`` cannot continue it."""
        n = self._number
        if "0" <= ch <= "9":
            if n == _MINUS:
                self._number = _ZERO if ch == "0" else _INT
            elif n == _ZERO:
                return False  # no leading zeros: "01" is no number
            elif n == _DOT:
                self._number = _FRAC
            elif n in (_E, _E_SIGN):
                self._number = _E_DIGITS
            return True
        if ch == "." and n in (_ZERO, _INT):
            self._number = _DOT
            return True
        if ch in "eE" and n in (_ZERO, _INT, _FRAC):
            self._number = _E
            return True
        if ch in "+-" and n == _E:
            self._number = _E_SIGN
            return True
        return False

    def _structural(self, ch: str) -> bool:
        """Read one non-blank character outside a token; False if the grammar refuses it."""
        state = self._state
        if state == _START:
            if ch != "{":
                return False
            self._stack.append("}")
            self._state = _KEY_OR_CLOSE
            return True
        if state in (_KEY_OR_CLOSE, _KEY):
            if ch == '"':
                self._state, self._key = _STRING, True
                return True
            return state == _KEY_OR_CLOSE and ch == "}" and self._close()
        if state == _COLON:
            if ch != ":":
                return False
            self._state = _VALUE
            return True
        if state == _AFTER:
            closer = self._stack[-1]
            if ch == ",":
                self._state = _KEY if closer == "}" else _VALUE
                return True
            return ch == closer and self._close()
        # _VALUE or _VALUE_OR_CLOSE
        if ch == "]" and state == _VALUE_OR_CLOSE:
            return self._close()
        if ch == '"':
            self._state, self._key = _STRING, False
        elif ch in "{[":
            if len(self._stack) >= MAX_DEPTH:
                return False
            self._stack.append("}" if ch == "{" else "]")
            self._state = _KEY_OR_CLOSE if ch == "{" else _VALUE_OR_CLOSE
        elif ch == "-" or "0" <= ch <= "9":
            self._state = _NUMBER
            self._number = _MINUS if ch == "-" else (_ZERO if ch == "0" else _INT)
        elif ch in _LITERALS:
            self._state, self._literal = _LITERAL, _LITERALS[ch]
        else:
            return False
        return True

    def _close(self) -> bool:
        self._stack.pop()
        self._state = _AFTER if self._stack else _DONE
        return True
