from __future__ import annotations

import dataclasses
import itertools
import tracemalloc

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from node.pipeline.stops import StopMatcher, StopSet, StopStep

# A tiny alphabet makes stops occur, overlap and straddle chunk boundaries often; "é" and "😀" check that
# matching is by code point.
ALPHABET = "ab\né😀"
texts = st.text(ALPHABET, max_size=30)
stop_lists = st.lists(st.text(ALPHABET, max_size=4), max_size=4)  # empty stops included: they are ignored


@st.composite
def chunkings(draw: st.DrawFn, text: str) -> list[str]:
    """Any split of text into consecutive chunks, empty chunks included."""
    cuts = sorted(draw(st.lists(st.integers(0, len(text)), max_size=len(text) + 2)))
    bounds = [0, *cuts, len(text)]
    return [text[a:b] for a, b in itertools.pairwise(bounds)]


def reference(text: str, stops: list[str]) -> tuple[int, int, str] | None:
    """(start, end, stop) of the match ending earliest, ties going to the longest stop; None if none."""
    found = [(at + len(s), -len(s), s) for s in stops if s and (at := text.find(s)) >= 0]
    if not found:
        return None
    end, _, stop = min(found)
    return end - len(stop), end, stop


def held_back(consumed: str, stops: list[str]) -> int:
    """Brute force: length of the longest suffix of consumed that is a proper prefix of some stop."""
    return max(
        (n for n in range(1, len(consumed) + 1) for s in stops if len(s) > n and s.startswith(consumed[-n:])),
        default=0,
    )


@settings(max_examples=300)
@given(data=st.data(), text=texts, stops=stop_lists, include=st.booleans())
def test_any_chunking_matches_the_reference(data: st.DataObject, text: str, stops: list[str], include: bool) -> None:
    check_against_reference(data.draw(chunkings(text)), stops, include, StopMatcher(stops, include_stop_str=include))


# Longer stops over a two-letter alphabet: self-overlapping prefixes ("abab", "aab") exercise the KMP
# fallbacks, and several stops share prefixes.
@settings(max_examples=300)
@given(
    data=st.data(),
    text=st.text("ab", max_size=60),
    stops=st.lists(st.text("ab", min_size=1, max_size=12), min_size=1, max_size=6),
    include=st.booleans(),
)
def test_long_overlapping_stops_match_the_reference(
    data: st.DataObject, text: str, stops: list[str], include: bool
) -> None:
    check_against_reference(data.draw(chunkings(text)), stops, include, StopMatcher(stops, include_stop_str=include))


@settings(max_examples=200)
@given(data=st.data(), text=st.text("ab\n", max_size=40), stops=st.lists(st.text("ab\n", max_size=8), max_size=5))
def test_matchers_sharing_one_stop_set_do_not_interfere(data: st.DataObject, text: str, stops: list[str]) -> None:
    """The n choices of a request share one StopSet: feeding them interleaved changes nothing."""
    shared = StopSet(stops)
    first, second = StopMatcher(shared, include_stop_str=False), StopMatcher(shared, include_stop_str=False)
    alone = StopMatcher(stops, include_stop_str=False)
    other_text = data.draw(st.text("ab\n", max_size=40))
    for chunk, other in itertools.zip_longest(data.draw(chunkings(text)), data.draw(chunkings(other_text))):
        if other is not None:
            second.feed(other)
        if chunk is not None:
            assert first.feed(chunk) == alone.feed(chunk)
    assert first.flush() == alone.flush()


def test_memory_is_linear_in_the_stop_length() -> None:
    """A 1 MB stop string (a 1 MB request body) used to build every prefix: ~10^12 bytes, an OOM."""
    stop = "ab" * 500_000
    tracemalloc.start()
    try:
        shared = StopSet([stop, "x" * 1000])
        matchers = [StopMatcher(shared, include_stop_str=False) for _ in range(64)]
        for m in matchers:
            m.feed("ab" * 1000)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    # The failure tables (4 bytes per character) plus 64 held suffixes of 2000 characters.
    assert peak < 8 * 1024 * 1024
    assert [m.feed("ab" * 10) for m in matchers[:1]] == [StopStep("")]


def check_against_reference(chunks: list[str], stops: list[str], include: bool, matcher: StopMatcher) -> None:
    text = "".join(chunks)
    match = reference(text, stops)
    emitted = ""
    consumed = ""
    for chunk in chunks:
        step = matcher.feed(chunk)
        was_stopped = match is not None and len(consumed) >= match[1]
        consumed += chunk
        emitted += step.emit
        if match is not None and len(consumed) >= match[1]:
            # Stopped exactly from the chunk that completes the match; nothing after it.
            start, end, stop = match
            assert step.stopped and step.matched == stop
            assert emitted == text[: end if include else start]
            if was_stopped:
                assert step.emit == ""
        else:
            # Not stopped yet: exactly the longest stop-prefix suffix is held back.
            assert not step.stopped and step.matched is None
            assert emitted == consumed[: len(consumed) - held_back(consumed, stops)]
    tail = matcher.flush()
    if match is None:
        assert emitted + tail == text
    else:
        assert tail == ""


@given(chunks=st.lists(st.text(max_size=8)))
def test_no_stops_is_a_pass_through(chunks: list[str]) -> None:
    matcher = StopMatcher(["", ""], include_stop_str=False)
    assert [matcher.feed(c) for c in chunks] == [StopStep(c) for c in chunks]
    assert matcher.flush() == ""


def feed_all(matcher: StopMatcher, chunks: list[str]) -> list[StopStep]:
    return [matcher.feed(c) for c in chunks]


def test_stop_spanning_three_chunks_never_leaks() -> None:
    steps = feed_all(StopMatcher(["</answer>"], include_stop_str=False), ["42</an", "sw", "er>tail"])
    assert [s.emit for s in steps] == ["42", "", ""]
    assert steps[-1] == StopStep("", True, "</answer>")


def test_false_start_is_released() -> None:
    matcher = StopMatcher(["</answer>"], include_stop_str=False)
    assert feed_all(matcher, ["a</an", "x", "</"]) == [StopStep("a"), StopStep("</anx"), StopStep("")]
    assert matcher.flush() == "</"


def test_include_stop_str() -> None:
    matcher = StopMatcher(["\n\n"], include_stop_str=True)
    assert feed_all(matcher, ["one\n", "\ntwo"]) == [StopStep("one"), StopStep("\n\n", True, "\n\n")]


def test_earliest_ending_match_wins() -> None:
    # "cd" completes before "abcdef" could: stop there, without waiting for the longer stop.
    matcher = StopMatcher(["abcdef", "cd"], include_stop_str=False)
    assert feed_all(matcher, ["xab", "cd"]) == [StopStep("x"), StopStep("ab", True, "cd")]


def test_tie_at_the_same_end_goes_to_the_longest() -> None:
    matcher = StopMatcher(["b", "ab"], include_stop_str=True)
    assert matcher.feed("xaby") == StopStep("xab", True, "ab")


def test_feeding_after_the_stop_returns_nothing() -> None:
    matcher = StopMatcher(["."], include_stop_str=False)
    assert matcher.feed("a.b") == StopStep("a", True, ".")
    assert matcher.feed("more") == StopStep("", True, ".")
    assert matcher.flush() == ""


@pytest.mark.parametrize("include", [True, False])
def test_stop_step_is_immutable(include: bool) -> None:
    step = StopMatcher(["x"], include_stop_str=include).feed("x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        step.emit = "y"  # type: ignore[misc]
