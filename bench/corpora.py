"""Realistic prompt text from what ships on these machines: prose, source code, CJK, a Latin-script language
with diacritics, and JSON tool schemas (no downloads).

| corpus | source | unit |
|---|---|---|
| ``prose`` | docstrings of the Python standard library (read with `ast`, nothing imported) | one docstring |
| ``code`` | the standard library's own ``.py`` sources | up to `CODE_CHUNK_LINES` lines of one file |
| ``cjk`` | Chinese and Japanese translations in the system's gettext catalogs (``/usr/share/locale``) | one message |
| ``latin`` | French, German and Czech translations in the same catalogs | one message |
| ``json`` | OpenAI tool schemas made from standard-library function signatures and docstrings | one tool |

A body is units drawn with its own seeded `random.Random` from the whole corpus until its budget is spent, so
bodies differ from one another all along (no shared paragraphs to cache at any depth) and the same seed gives
the same text on every machine with the same Python and Debian packages. Sizes are measured with the model
folder's own tokenizer, like `bench.prompts` does for its synthetic text; ``synthetic`` is that module's word
list, kept for comparison with the earlier runs.
"""

from __future__ import annotations

import ast
import functools
import json
import random
import struct
import sys
import sysconfig
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final, Literal, get_args

from tokenizers import Tokenizer

from bench import prompts
from bench.prompts import PromptPool, request_prefix

Corpus = Literal["synthetic", "prose", "code", "cjk", "latin", "json"]
CORPORA: Final[tuple[Corpus, ...]] = get_args(Corpus)

LOCALE_DIR: Final = Path("/usr/share/locale")
CJK_LANGUAGES: Final = ("zh_CN", "ja")
LATIN_LANGUAGES: Final = ("fr", "de", "cs")
# A code unit is at most this many lines: whole modules would be larger than the 200-token prompts.
CODE_CHUNK_LINES: Final = 40
# Units shorter than this say too little to be text (single words, format strings).
MIN_UNIT_CHARS: Final = 24
# Units are encoded in batches while a body is filled.
_BATCH: Final = 32
# The widest request number a run uses (as in `bench.prompts`).
_NUMBER_FOR_SIZING: Final = 1_000_000
# A body this close to its budget is done; further from it, the next unit's leading lines top it up.
_CLOSE_ENOUGH_TOKENS: Final = 16
# JSON bodies are wrapped as a list: "[\n" + units joined by ",\n" + "\n]".
_JSON_WRAP_TOKENS: Final = 4


class CorpusError(Exception):
    """A corpus has no text on this machine (e.g. no gettext catalogs for its languages)."""


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = ("test", "idlelib", "lib2to3", "site-packages", "tkinter", "turtledemo", "ensurepip")
    return sorted(p for p in root.rglob("*.py") if not any(part in skip for part in p.relative_to(root).parts))


def _modules() -> list[tuple[Path, ast.Module]]:
    parsed: list[tuple[Path, ast.Module]] = []
    for path in _stdlib_files():
        try:
            parsed.append((path, ast.parse(path.read_text("utf-8"))))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
    return parsed


def _prose() -> list[str]:
    units: list[str] = []
    for _, module in _modules():
        for node in ast.walk(module):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= MIN_UNIT_CHARS:
                    units.append(doc)
    return units


def _code() -> list[str]:
    units: list[str] = []
    for path in _stdlib_files():
        try:
            lines = path.read_text("utf-8").splitlines()
        except (UnicodeDecodeError, OSError):
            continue
        for start in range(0, len(lines), CODE_CHUNK_LINES):
            chunk = "\n".join(lines[start : start + CODE_CHUNK_LINES]).strip("\n")
            if len(chunk) >= MIN_UNIT_CHARS:
                units.append(chunk)
    return units


def read_mo(data: bytes) -> list[str]:
    """The translations (first plural form) of a GNU gettext ``.mo`` catalog, skipping its header entry.

    Raises:
        ValueError: ``data`` is not a ``.mo`` file.
    """
    if len(data) < 20:
        raise ValueError("too short for a .mo file")
    magic = struct.unpack_from("<I", data)[0]
    order = "<" if magic == 0x950412DE else ">" if magic == 0xDE120495 else None
    if order is None:
        raise ValueError("bad .mo magic")
    count, _, translations = struct.unpack_from(f"{order}III", data, 8)
    out: list[str] = []
    for i in range(count):
        length, offset = struct.unpack_from(f"{order}II", data, translations + 8 * i)
        raw = data[offset : offset + length].split(b"\0", 1)[0]
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            continue
        if text and not text.startswith("Project-Id-Version"):
            out.append(text)
    return out


def _catalogs(languages: Sequence[str], keep: Callable[[str], bool]) -> list[str]:
    units: list[str] = []
    seen: set[str] = set()
    for language in languages:
        for path in sorted((LOCALE_DIR / language / "LC_MESSAGES").glob("*.mo")):
            try:
                messages = read_mo(path.read_bytes())
            except (OSError, ValueError, struct.error):
                continue
            for message in messages:
                text = message.strip()
                if len(text) >= MIN_UNIT_CHARS // 2 and keep(text) and text not in seen:
                    seen.add(text)
                    units.append(text)
    return units


def _is_cjk(text: str) -> bool:
    return sum(1 for ch in text if "\u3040" <= ch <= "\u9fff") * 3 >= len(text)


def _has_diacritics(text: str) -> bool:
    return any(ch.isalpha() and not ch.isascii() for ch in text)


def _json_type(annotation: ast.expr | None, default: ast.expr | None) -> str:
    name = ast.unparse(annotation) if annotation is not None else ""
    value = default.value if isinstance(default, ast.Constant) else None
    if "bool" in name or isinstance(value, bool):
        return "boolean"
    if "int" in name or isinstance(value, int):
        return "integer"
    if "float" in name or isinstance(value, float):
        return "number"
    if "list" in name or "Sequence" in name or isinstance(default, ast.List | ast.Tuple):
        return "array"
    if "dict" in name or "Mapping" in name or isinstance(default, ast.Dict):
        return "object"
    return "string"


def _tools() -> list[str]:
    units: list[str] = []
    for path, module in _modules():
        for node in module.body:
            if not isinstance(node, ast.FunctionDef) or node.name.startswith("_"):
                continue
            doc = ast.get_docstring(node)
            args = [a for a in node.args.args if a.arg not in ("self", "cls")]
            if not doc or not args:
                continue
            defaults: list[ast.expr | None] = [None] * (len(args) - len(node.args.defaults))
            defaults += list(node.args.defaults)[-len(args) :] if args else []
            properties = {
                a.arg: {"type": _json_type(a.annotation, d), "description": f"The {a.arg.replace('_', ' ')}."}
                for a, d in zip(args, defaults, strict=False)
            }
            tool = {
                "type": "function",
                "function": {
                    "name": f"{path.stem}_{node.name}",
                    "description": " ".join(doc.split("\n\n", 1)[0].split()),
                    "parameters": {
                        "type": "object",
                        "properties": properties,
                        "required": [a.arg for a, d in zip(args, defaults, strict=False) if d is None],
                    },
                },
            }
            units.append(json.dumps(tool, indent=2, ensure_ascii=False))
    return units


_SOURCES: Final[dict[Corpus, Callable[[], list[str]]]] = {
    "prose": _prose,
    "code": _code,
    "cjk": lambda: _catalogs(CJK_LANGUAGES, _is_cjk),
    "latin": lambda: _catalogs(LATIN_LANGUAGES, _has_diacritics),
    "json": _tools,
}
_JOINERS: Final[dict[Corpus, str]] = {"prose": "\n\n", "code": "\n\n", "cjk": "\n", "latin": "\n", "json": ",\n"}


@functools.cache
def units(corpus: Corpus) -> tuple[str, ...]:
    """Every unit of ``corpus``, in a fixed order.

    Raises:
        CorpusError: the corpus is empty on this machine.
    """
    found = tuple(_SOURCES[corpus]())
    if not found:
        raise CorpusError(f"corpus {corpus!r} found no text on this machine")
    return found


def build_pool(
    corpus: Corpus, tokenizer: Tokenizer, overhead_tokens: int, target_tokens: int, count: int, seed: int = 0
) -> PromptPool:
    """``count`` distinct bodies of ``corpus`` whose templated prompt is about ``target_tokens`` long.

    Raises:
        CorpusError: the corpus is empty on this machine.
        ValueError: the target leaves no room for a body.
    """
    if corpus == "synthetic":
        return prompts.build_pool(tokenizer, overhead_tokens, target_tokens, count, seed)
    fixed = overhead_tokens + len(tokenizer.encode(request_prefix(_NUMBER_FOR_SIZING), add_special_tokens=False).ids)
    budget = target_tokens - fixed - (_JSON_WRAP_TOKENS if corpus == "json" else 0)
    if budget < 8:
        raise ValueError(f"target of {target_tokens} tokens leaves no room for a body (overhead {fixed})")
    pool = units(corpus)
    bodies: list[str] = []
    measured: list[int] = []
    for index in range(count):
        seed_text = f"{corpus}/{seed}/{target_tokens}/{index}"
        body = _body(corpus, tokenizer, random.Random(seed_text), pool, budget)
        size = len(tokenizer.encode(body, add_special_tokens=False).ids)
        # Units' lengths alone miss a token here and there at the joins: refill once with the difference
        # (the same seed draws the same units in the same order).
        body = _body(corpus, tokenizer, random.Random(seed_text), pool, 2 * budget - size)
        bodies.append(body)
        measured.append(fixed + len(tokenizer.encode(body, add_special_tokens=False).ids))
    return PromptPool(target_tokens=target_tokens, bodies=tuple(bodies), prompt_tokens=tuple(measured))


def _body(corpus: Corpus, tokenizer: Tokenizer, rng: random.Random, pool: Sequence[str], budget: int) -> str:
    joiner = _JOINERS[corpus]
    parts = _fill(tokenizer, rng, pool, joiner, budget)
    if corpus == "json":
        return "\n[\n" + joiner.join(parts) + "\n]"
    return "\n" + joiner.join(parts)


def _fill(tokenizer: Tokenizer, rng: random.Random, pool: Sequence[str], joiner: str, budget: int) -> list[str]:
    """Units drawn at random (each at most once) adding up to at most ``budget`` tokens with their joiners.

    A unit that would overshoot is skipped rather than cut, so short targets get whole short units; a
    text's length is close to the sum of its units' (the joiners split the pre-tokenizer's pieces).
    """
    order = rng.sample(range(len(pool)), len(pool))
    joiner_tokens = len(tokenizer.encode(joiner, add_special_tokens=False).ids)
    parts: list[str] = []
    used = 0
    misses = 0
    for start in range(0, len(order), _BATCH):
        batch = [pool[i] for i in order[start : start + _BATCH]]
        for unit, encoding in zip(batch, tokenizer.encode_batch(batch, add_special_tokens=False), strict=True):
            size = len(encoding.ids) + joiner_tokens
            if used + size > budget:
                misses += 1
                if misses > 4 * _BATCH or budget - used < _CLOSE_ENOUGH_TOKENS:
                    return _with_head(tokenizer, parts, unit, budget - used - joiner_tokens)
                continue
            parts.append(unit)
            used += size
    return parts


def main(argv: Sequence[str] | None = None) -> int:
    """Print unit counts and one sample per corpus (a quick look at what a machine has)."""
    del argv
    for corpus in CORPORA[1:]:
        try:
            found = units(corpus)
        except CorpusError as exc:
            print(f"{corpus}: {exc}")
            continue
        chars = sum(map(len, found))
        print(f"{corpus}: {len(found):,} units, {chars:,} chars; e.g. {found[len(found) // 2][:80]!r}")
    return 0


if __name__ == "__main__":
    sys.exit(main())


def _with_head(tokenizer: Tokenizer, parts: list[str], unit: str, room: int) -> list[str]:
    """``parts`` plus the most leading lines of ``unit`` that fit in ``room`` tokens (JSON units stay whole:
    a cut one would not parse)."""
    lines = unit.split("\n")
    if room < _CLOSE_ENOUGH_TOKENS or unit.lstrip().startswith("{") or len(lines) < 2:
        return parts
    low, high = 0, len(lines) - 1  # the largest fitting count of leading lines is in [low, high]
    while low < high:
        mid = (low + high + 1) // 2
        if len(tokenizer.encode("\n".join(lines[:mid]), add_special_tokens=False).ids) <= room:
            low = mid
        else:
            high = mid - 1
    return [*parts, "\n".join(lines[:low])] if low else parts
