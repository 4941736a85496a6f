"""The JSON-object prefix validator: it accepts every prefix of every JSON object text, whatever the chunking,
and what it accepts always completes to a JSON object (its `completion` is the witness)."""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from node.pipeline.parsers.jsonprefix import MAX_DEPTH, JsonPrefix

_scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(10**20), 10**20)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
_values = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)
_objects = st.dictionaries(st.text(max_size=5), _values, max_size=5)
_layouts = st.sampled_from([{}, {"indent": 2}, {"separators": (",", ":")}, {"ensure_ascii": False}])
_cuts = st.lists(st.integers(0, 400), max_size=10)


def _feed(text: str, cuts: list[int]) -> tuple[JsonPrefix, int]:
    """Feed ``text`` in pieces split at ``cuts``, as a stream would; return the validator and the accepted length."""
    validator = JsonPrefix()
    accepted = 0
    bounds = sorted({min(c, len(text)) for c in cuts} | {len(text)})
    for bound in bounds:
        accepted = validator.feed(text, accepted, bound)
        if accepted < bound:
            break
    return validator, accepted


@given(value=_objects, layout=_layouts, cuts=_cuts)
@settings(max_examples=300, deadline=None)
def test_every_json_object_is_accepted_whole_for_any_chunking(
    value: dict[str, object], layout: dict[str, object], cuts: list[int]
) -> None:
    text = json.dumps(value, **layout)  # type: ignore[arg-type]
    validator, accepted = _feed(text, cuts)
    assert accepted == len(text) and validator.done and not validator.broken
    for end in range(len(text)):  # every proper prefix is a prefix, not yet done
        prefix = JsonPrefix()
        assert prefix.feed(text, 0, end) == end and not prefix.done and not prefix.broken


_JUNK = [
    "{",
    "}",
    "[",
    "]",
    '"',
    "\\",
    ":",
    ",",
    " ",
    "\n",
    "a",
    "1",
    "0",
    "-",
    ".",
    "e",
    "+",
    "true",
    "nul",
    "u",
    "12",
    '"k"',
    "é",
    "\x01",
    "\\u00",
    "f",
]


@given(pieces=st.lists(st.sampled_from(_JUNK), max_size=40), cuts=_cuts)
@settings(max_examples=800, deadline=None)
def test_what_is_accepted_completes_to_an_object_and_chunking_does_not_matter(
    pieces: list[str], cuts: list[int]
) -> None:
    text = "{" + "".join(pieces)
    validator, accepted = _feed(text, cuts)
    whole = JsonPrefix()
    assert whole.feed(text) == accepted and whole.broken == validator.broken and whole.done == validator.done
    if validator.done:
        assert isinstance(json.loads(text[:accepted]), dict)
    elif not validator.broken:
        assert isinstance(json.loads(text[:accepted] + validator.completion()), dict)
    else:  # broken: the text is no JSON object (whatever follows the accepted prefix)
        assert accepted < len(text)
        try:
            json.loads(text)
        except ValueError:
            pass
        else:
            raise AssertionError(f"refused a JSON object: {text!r}")
        cut = JsonPrefix()
        assert cut.feed(text, 0, accepted) == accepted and not cut.broken
        assert isinstance(json.loads(text[:accepted] + cut.completion()), dict)


def test_refusals() -> None:
    refused = [(" {}", 0), ("[]", 0), ('{"a": 01}', 7), ('{"a": 1.}', 8), ('{"a": "\x01"}', 7), ('{"a": tru }', 9)]
    refused += [('{"a" 1}', 5), ('{"a": 1,}', 8), ('{"a": "\\x"}', 8), ('{"a": "\\u12g4"}', 11), ("{}}", 2)]
    for text, at in refused:
        validator = JsonPrefix()
        assert validator.feed(text) == at, text
        assert validator.broken != (text == "{}}"), text
    deep = JsonPrefix()
    text = '{"a": ' + "[" * (MAX_DEPTH + 5)
    assert deep.feed(text) == len('{"a": ') + MAX_DEPTH - 1 and deep.broken
