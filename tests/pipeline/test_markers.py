"""Marker sets shared between requests answer exactly as a set built for one request."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from node.pipeline.parsers.markers import MarkerSet, marker_set

_ALPHABET = "<>/tk_ab|"
markers = st.lists(st.text(_ALPHABET, min_size=0, max_size=6), min_size=1, max_size=3)
texts = st.text(_ALPHABET, max_size=30)


@given(markers, texts)
def test_a_shared_set_finds_and_holds_back_as_a_fresh_one(ms: list[str], text: str) -> None:
    shared, fresh = marker_set(*ms), MarkerSet(ms)
    assert shared.find(text) == fresh.find(text)
    assert shared.held_len(text) == fresh.held_len(text)
    assert shared.may_hold(text) == fresh.may_hold(text)
    assert shared.resume_at(text) == fresh.resume_at(text)


def test_requests_with_the_same_markers_share_one_set() -> None:
    assert marker_set("<think>") is marker_set("<think>")
    assert marker_set("<think>") is not marker_set("</think>")
