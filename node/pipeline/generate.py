"""Compatibility names: the generation core is now the pipeline's Dispatch (node/pipeline/dispatch.py) and
Output (node/pipeline/output.py) stages; its types live in spec.py and events.py."""

from __future__ import annotations

from node.pipeline.events import TokenLogprob, Usage
from node.pipeline.spec import GenerateSpec

__all__ = ["GenerateSpec", "TokenLogprob", "Usage"]
