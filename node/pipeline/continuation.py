"""The continue step: a choice's generation carried on by a new worker request after the gateway wrote some
tokens of the answer itself (pure: Dispatch runs it, the Output stage says when and with what).

Today's one use is the reasoning budget: when a choice has reasoned ``think_budget`` tokens and is still
inside its block, the Output stage pauses it, Dispatch aborts that worker stream, the Output stage closes
the block with the family's marker (``</think>\\n\\n`` for Qwen3 / DeepSeek-R1; registry.REASONING_CLOSE)
as if the model had written it, and the choice goes on from

    prompt = original prompt ids + every id the choice produced so far (the marker's last)

with ``max_tokens`` less what it produced, so the client's answer (one Output stage, one usage) is what one
generation with the block closed at the budget would have been. Any API whose Output stage pauses a choice
gets it (a chat ``thinking_token_budget``, say): nothing here knows about reasoning.

Only a spec of one choice is continued: the n choices of one worker request share its stream.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from node.pipeline.spec import GenerateSpec


def room_to_continue(max_tokens: int, produced: int, forced: int) -> bool:
    """Whether a choice that produced ``produced`` tokens can take ``forced`` more from the gateway and still
    leave the model at least one token of its own within ``max_tokens``."""
    return produced + forced < max_tokens


def continuation_spec(spec: GenerateSpec, produced: Sequence[int], step: int) -> GenerateSpec:
    """``spec`` (the request as Prepare made it) continued after ``produced``: every id its one choice has so
    far, the gateway's own included. The worker request id gets a ``-c{step}`` suffix: the stream it replaces
    is being aborted under the old id, which must not take the new one with it.

    Raises:
        ValueError: the spec has more than one choice, or ``produced`` leaves no room under ``max_tokens``.
    """
    params = spec.params
    if params.n != 1:
        raise ValueError(f"only a spec of one choice is continued (n={params.n})")
    if len(produced) >= params.max_tokens:
        raise ValueError(f"{len(produced)} tokens produced leave none of max_tokens={params.max_tokens}")
    return replace(
        spec,
        request_id=f"{spec.request_id}-c{step}",
        prompt_ids=[*spec.prompt_ids, *produced],
        params=replace(
            params,
            max_tokens=params.max_tokens - len(produced),
            min_tokens=max(0, params.min_tokens - len(produced)),
        ),
    )
