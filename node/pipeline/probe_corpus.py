"""A small built-in corpus for checking, when a tokenizer loads, that a faster encoding path gives the same
ids as Hugging Face ``tokenizers``. It aims at the places where two implementations of one tokenizer
drift apart: regex classes (letters, marks, numbers, punctuation, whitespace of every kind), contraction
and case-folding rules, multi-byte UTF-8, long runs, and added-token text (whole, partial and adjacent).
"""

from __future__ import annotations

from collections.abc import Iterable

_FIXED: tuple[str, ...] = (
    "",
    "Hello world, this is a test",
    "The quick brown fox jumps over the lazy dog. It's 5 o'clock; we'll see—they're late, I'd say.",
    "DON'T SHOUT: I'M HERE, YOU'VE GOT IT, WE'LL GO, HE'D KNOW, SHE'S RIGHT, THEY'RE OFF. 'ſ 'K 'S",
    "def encode(self, text: str) -> list[int]:\n    return [ord(c) for c in text]  # ids\n\n\n",
    '{"model": "llama", "messages": [{"role": "user", "content": "hi"}], "n": 1e-3, "ok": true}',
    '<div class="x">&amp; <b>bold</b></div>\r\n<script>if (a<b && c>d) { x++; }</script>',
    "    indented\tand\ttabbed\n\t\t\tdeep\r\n\r\n  \n \n\n\n\n   trailing   ",
    "1234567890 3.14159 1,000,000 -42 +7 0x1F 1e10 12345678901234567890 ١٢٣٤ １２３ ²³ Ⅻ ½",
    "你好，世界！这是一个测试。日本語のテキスト、カタカナ・ひらがな。한국어 텍스트입니다.",
    "Emoji: 🎉👩‍👩‍👧‍👦🇺🇸👍🏽❤️‍🔥 ✨🤖🧠 …and more!!!???",
    "naïve café résumé — Ångström, Straße, İstanbul, ΣΊΣΥΦΟΣ, Ελληνικά, русский текст, עִבְרִית, العربية",
    "e\u0301 a\u0308 n\u0303 \u0915\u093f\u0928\u094d\u0926\u0940 ภาษาไทย ສະບາຍດີ ᄀᄁ",
    "\u00a0nbsp\u2003em\u3000ideo\u200bzwsp\u2028line\u2029para\u0085nel\u180emvs\ufeffbom",
    "\x00\x01\x07\x1b[31mred\x1b[0m\x7f\x1c\x1d\x1e\x1f \ue000\U000f0000 \ufffd \U0001d400\U0001d7d8",
    "!!!!!!!!!!!!!!!!!!!!----------==========__________..........,,,,,,,,''''\"\"\"\"````~~~~",
    "a" * 300 + " " + "ab" * 150 + " " + "🎉" * 40 + " " + " " * 257 + "\n" * 65 + "\t" * 33,
    "x" + " " * 7 + "y" + "\n \n \n" + "z \t \n",
    "Math: ∀x∈ℝ, ∑ᵢ xᵢ² ≥ 0; f(x) = ⌈x⌉ ⊕ ⌊x⌋ → ∞. Currency: $5 €10 ¥100 £3 ₹99 ₿0.1",
)


def probe_texts(added_tokens: Iterable[str]) -> list[str]:
    """The corpus plus texts built from the tokenizer's own added tokens: each token alone, all of them
    adjacent and interleaved with text, and truncated fragments that must stay ordinary text."""
    tokens = [t for t in added_tokens if t]
    texts = list(_FIXED)
    if not tokens:
        return texts
    texts.append("".join(tokens))
    texts.append(" ".join(tokens))
    texts.append("".join(f"{t}x{i} \n" for i, t in enumerate(tokens)))
    texts.append("".join(f"{t[:-1]}|{t[1:]}" for t in tokens))
    chat = "".join(f"{tokens[i % len(tokens)]}turn {i}: {_FIXED[i % len(_FIXED)]}" for i in range(12))
    texts.append(chat)
    texts.extend(tokens[:64])
    texts.extend(f" {t} " for t in tokens[:16])
    return texts
