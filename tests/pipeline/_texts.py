"""Hypothesis strategies for tokenizer inputs that stress where encoders can disagree."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import strategies as st

# Characters and clusters regex engines and BPE implementations are known to treat differently.
TRICKY = (
    "'s", "'S", "'ſ", "'ll", "'LL", "'Re", "’s", "'K", "'\u212a", "中文", "日本語", "カタカナ・ひらがな", "한국어",
    "🎉", "👩‍👩‍👧‍👦", "🇺🇸", "👍🏽", "e\u0301", "\u0915\u093f", "\u200b", "\u200d", "\ufeff", "\u180e",
    "١٢٣", "１２３", "²", "Ⅻ", "ǅ", "ß", "İ", "\x00", "\x1b", "\x85", "\ue000", "\U000e0001", "\U0010fffd",
    "...", "!!!", "--", "://", "</", "/>", "<!--", "```", "\\n", "$$", "12.5%", "1,000", "0x1F",
)  # fmt: skip
WHITESPACE = (" ", "\n", "\t", "\r\n", "\r", "\u3000", "\u00a0", "\u2028", "  \n", "\n ", " \t\n")


def fragments(specials: Sequence[str]) -> st.SearchStrategy[str]:
    """Added-token text whole, its proper prefixes and suffixes, and near-miss soup of its characters."""
    whole = st.sampled_from(specials)
    prefix = whole.flatmap(lambda s: st.integers(1, max(1, len(s) - 1)).map(lambda i: s[:i]))
    suffix = whole.flatmap(lambda s: st.integers(1, max(1, len(s) - 1)).map(lambda i: s[i:]))
    soup_alphabet = sorted({c for s in specials for c in s}) or ["<"]
    soup = st.text(st.sampled_from(soup_alphabet), min_size=1, max_size=8)
    return st.one_of(whole, prefix, suffix, soup)


def adversarial_text(specials: Sequence[str] = (), *, max_pieces: int = 16) -> st.SearchStrategy[str]:
    """Concatenations of arbitrary unicode (unassigned code points included), tricky clusters, whitespace
    runs (up to a few hundred), numbers, words and added-token fragments."""
    pieces: list[st.SearchStrategy[str]] = [
        st.text(st.characters(exclude_categories=("Cs",)), max_size=8),
        st.sampled_from(TRICKY),
        st.builds(lambda w, n: w * n, st.sampled_from(WHITESPACE), st.integers(1, 300)),
        st.integers(0, 10**15).map(str),
        st.sampled_from(("Hello", " world", " the", "ing", " don't", "API", " 2024", "é", "\n\n", " ")),
        st.text(st.sampled_from("ab cd<|>/\n"), min_size=1, max_size=10),
    ]
    if specials:
        pieces.append(fragments(specials))
        pieces.append(st.sampled_from(specials))
    return st.lists(st.one_of(pieces), max_size=max_pieces).map("".join)
