"""Realistic prompt corpora and the no-BOS Llama-3 folder the gateway benchmark runs on."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from bench import corpora, folders


def _mo(pairs: list[tuple[str, str]]) -> bytes:
    """A little-endian GNU .mo catalog holding ``pairs`` (msgid, msgstr)."""
    count = len(pairs)
    originals, translations = 28, 28 + 8 * count
    data = b""
    blob_start = 28 + 16 * count
    orig_table, trans_table = b"", b""
    for msgid, _ in pairs:
        raw = msgid.encode()
        orig_table += struct.pack("<II", len(raw), blob_start + len(data))
        data += raw + b"\0"
    for _, msgstr in pairs:
        raw = msgstr.encode()
        trans_table += struct.pack("<II", len(raw), blob_start + len(data))
        data += raw + b"\0"
    header = struct.pack("<IIIIIII", 0x950412DE, 0, count, originals, translations, 0, 0)
    return header + orig_table + trans_table + data


def test_read_mo_returns_translations_without_the_header() -> None:
    catalog = _mo([("", "Project-Id-Version: x\n"), ("File", "Fichier"), ("Open", "Öffnen\0Öffnen (plural)")])
    assert corpora.read_mo(catalog) == ["Fichier", "Öffnen"]
    with pytest.raises(ValueError):
        corpora.read_mo(b"not a catalog at all")


def test_latin_bodies_are_distinct_sized_and_accented(llama3_model_dir: Path) -> None:
    try:
        corpora.units("latin")
    except corpora.CorpusError:
        pytest.skip("no gettext catalogs on this machine")
    tokenizer = Tokenizer.from_file(str(llama3_model_dir / "tokenizer.json"))
    pool = corpora.build_pool("latin", tokenizer, 10, 800, 4)
    assert len(set(pool.bodies)) == 4
    assert all(760 <= size <= 830 for size in pool.prompt_tokens), pool.prompt_tokens
    assert all(any(not c.isascii() and c.isalpha() for c in body) for body in pool.bodies)


def test_nobos_folder_drops_only_the_bos_step(llama3_model_dir: Path, tmp_path: Path) -> None:
    target = folders.without_bos_step(llama3_model_dir, tmp_path / "llama3-nobos")
    with_bos = Tokenizer.from_file(str(llama3_model_dir / "tokenizer.json"))
    without = Tokenizer.from_file(str(target / "tokenizer.json"))
    assert with_bos.encode("Hello world").ids[0] == 128000
    assert without.encode("Hello world").ids == with_bos.encode("Hello world").ids[1:]
    assert json.loads((target / "tokenizer.json").read_text())["post_processor"]["type"] == "ByteLevel"
    # A peer that rebuilds the BOS step from tokenizer_config.json (as transformers and SMG do) must not.
    assert json.loads((llama3_model_dir / "tokenizer_config.json").read_text())["add_bos_token"] is True
    config = json.loads((target / "tokenizer_config.json").read_text())
    assert config["add_bos_token"] is False
    assert (
        config["chat_template"] == json.loads((llama3_model_dir / "tokenizer_config.json").read_text())["chat_template"]
    )
    with pytest.raises(folders.LaunchError):
        folders.without_bos_step(target, tmp_path / "again")
