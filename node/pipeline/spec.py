"""What the Prepare stage hands to Dispatch: one ``GenerateSpec`` per prompt, token ids and engine params
resolved, nothing left that depends on the API the request came from."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from node.pipeline.parsing import ParserPlan
from node.pipeline.served_model import ServedModel
from node.workers.types import SamplingParams


@dataclass(frozen=True, slots=True)
class GenerateSpec:
    request_id: str
    prompt_ids: Sequence[int]
    params: SamplingParams
    stops: tuple[str, ...] = ()
    include_stop_str: bool = False
    # Token ids that end an answer without being part of it (EOS unless ignore_eos, plus stop_token_ids).
    terminators: frozenset[int] = frozenset()
    routing_key: str | None = None
    # The served model the request names: only its workers are candidates (None: any worker).
    model: str | None = None
    # Keep per-token ids on deltas (the Completions API's echo/logprobs need them).
    want_token_ids: bool = False
    # The tokenizer's vocabulary: a worker id outside [0, vocab_size) is a worker fault (0: unchecked).
    vocab_size: int = 0
    # Whether the client streams. A non-streaming answer without stop strings needs no early look at the
    # tokens, so the worker is asked for one final message instead of a stream (cheaper on both sides).
    client_stream: bool = True
    # The output parsers of each choice (reasoning, tool calls); None: the text is all content.
    parsing: ParserPlan | None = None


@dataclass(frozen=True, slots=True)
class PreparedPrompt:
    ids: Sequence[int]
    text: str | None  # known for text prompts; token prompts are decoded only if an adapter asks (echo)


@dataclass(frozen=True, slots=True)
class Prepared:
    """A request ready to run: ``specs[k]`` generates for ``prompts[k]``."""

    model: ServedModel
    request_id: str
    prompts: tuple[PreparedPrompt, ...]
    specs: tuple[GenerateSpec, ...]

    @property
    def params(self) -> SamplingParams:
        """The engine params every spec shares but for ``max_tokens`` (first prompt's)."""
        return self.specs[0].params

    @property
    def reserve_tokens(self) -> int:
        """The most tokens this request can use: every prompt plus every choice's output budget."""
        return sum(len(spec.prompt_ids) + spec.params.n * spec.params.max_tokens for spec in self.specs)
