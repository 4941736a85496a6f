"""Reading ``<open>value</close>`` runs with str.find: linear in the text whatever it holds (a lazy regex
such as ``<a>(.*?)</a>`` rescans to the end from every unclosed tag: quadratic on hostile output)."""

from __future__ import annotations


def tagged_runs(
    text: str, start: int, open_tag: str, open_end: str, close_tag: str, *, limit: int = -1
) -> list[tuple[str, str]] | None:
    """From ``start``, a sequence of ``{open_tag}HEAD{open_end}BODY{close_tag}`` separated only by whitespace,
    as (HEAD, BODY) pairs; None if anything else is found. With ``open_end`` "", HEAD is "" and the body
    starts right after ``open_tag``. With ``limit`` >= 0, stops after that many runs (the rest unread)."""
    runs: list[tuple[str, str]] = []
    pos, size = start, len(text)
    while len(runs) != limit:
        at = text.find(open_tag, pos)
        gap_end = size if at < 0 else at
        if text[pos:gap_end].strip():
            return None
        if at < 0:
            return runs
        head_start = at + len(open_tag)
        if open_end:
            head_end = text.find(open_end, head_start)
            if head_end < 0:
                return None
            body_start = head_end + len(open_end)
        else:
            head_end = body_start = head_start
        close = text.find(close_tag, body_start)
        if close < 0:
            return None
        runs.append((text[head_start:head_end], text[body_start:close]))
        pos = close + len(close_tag)
    return runs
