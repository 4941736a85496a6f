"""bench.encoder_bench: a smoke run prints a row per engine with the native encoder as the ratio's base."""

from __future__ import annotations

import pytest

from bench import encoder_bench


def test_smoke_prints_every_engine(capsys: pytest.CaptureFixture[str]) -> None:
    assert encoder_bench.main(["--folders", "qwen", "--corpora", "prose", "--texts", "2", "--chars", "3000",
                               "--rounds", "1", "--hf"]) == 0  # fmt: skip
    rows = [line.split("|") for line in capsys.readouterr().out.splitlines()[2:]]
    engines = {row[5].strip(): float(row[7]) for row in rows}
    assert set(engines) == {"native", "tiktoken", "huggingface"}
    assert engines["native"] == 1.0
    assert all(row[3].strip() == "2" and int(row[4].strip().replace(",", "")) > 500 for row in rows)


def test_texts_are_distinct_and_of_the_asked_size() -> None:
    texts = encoder_bench.texts_of("prose", 5, 2000)
    assert len(texts) == 5 and len(set(texts)) == 5
    assert all(len(t) == 2000 for t in texts)
