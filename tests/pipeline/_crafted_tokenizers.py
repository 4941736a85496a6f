"""Small tokenizers built with the ``tokenizers`` API for the encoder and cache tests: a byte-level BPE
trained in-process (fast-path eligible), the same with awkward added tokens, and SentencePiece-style ones."""

from __future__ import annotations

import functools
from collections.abc import Sequence

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers, processors, trainers
from tokenizers import Tokenizer as HfTokenizer

from node.pipeline.tokenizer import Tokenizer

LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_CORPUS = (
    "The quick brown fox jumps over the lazy dog. It's the 3rd time; they'll see 12345 apples.\n",
    "def encode(text):\n    return [ord(c) for c in text]  # code\n\n",
    "naïve café — 你好世界, こんにちは 🎉🎉 emoji and   spaces\t\ttabs\r\n",
    "<div class='x'>a<b && c>d</div> <|a|> <|b|> [INST] ok [/INST]",
) * 20

# Overlapping added tokens: one is a prefix of another, one contains another, two chain into each other.
OVERLAPPING = ("<|a|>", "<|a|><|b|>", "<|b|>", "a|><|b", "[INST]", "[INST] [/INST]", "[/INST]", "ST]x")


def train_byte_bpe(vocab_size: int = 700, splits: Sequence[str] = (LLAMA3_SPLIT,)) -> HfTokenizer:
    """A byte-level BPE trained on a small corpus. ``splits`` are isolating regex splits applied in order
    before ByteLevel; with none, ByteLevel splits with GPT-2's regex."""
    tok = HfTokenizer(models.BPE())
    steps = [pre_tokenizers.Split(Regex(s), behavior="isolated") for s in splits]
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [*steps, pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=not splits)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False
    )
    tok.train_from_iterator(_CORPUS, trainer)
    return tok


def wrap(tok: HfTokenizer, **kwargs: object) -> Tokenizer:
    return Tokenizer.from_bytes(tok.to_str().encode(), **kwargs)  # type: ignore[arg-type]


@functools.cache
def byte_bpe(specials: Sequence[str] = ("<|bos|>", "<|eot|>"), normalized: Sequence[str] = ()) -> HfTokenizer:
    """A trained byte-level BPE with ``specials`` (special, matched on raw text) and ``normalized``
    (non-special added tokens matched in Hugging Face's second pass). ``add_special_tokens=True`` puts
    the first special before the text and the last one after it."""
    tok = train_byte_bpe()
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    tok.add_tokens([AddedToken(s, special=False, normalized=True) for s in normalized])
    first, last = specials[0], specials[-1]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{first} $A {last}",
        special_tokens=[(first, tok.token_to_id(first)), (last, tok.token_to_id(last))],
    )
    return tok


@functools.cache
def metaspace(prepend_scheme: str) -> HfTokenizer:
    """A SentencePiece-style BPE: Metaspace pre-tokenizer with ``prepend_scheme``, specials <s> </s>."""
    tok = HfTokenizer(models.BPE(unk_token="<unk>"))
    tok.normalizer = normalizers.NFKC()
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme=prepend_scheme)
    tok.decoder = decoders.Metaspace(replacement="▁", prepend_scheme=prepend_scheme)
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=["<unk>", "<s>", "</s>"], show_progress=False)
    tok.train_from_iterator(_CORPUS, trainer)
    return tok
