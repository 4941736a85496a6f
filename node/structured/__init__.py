"""Structured output as values: the constraint the engine contract carries, the checks an engine's constrained
decoder would apply, and the regex tree. Shared by the gateway (node.pipeline.constraints reads requests into
them) and the simulated engine (node.sim writes answers that satisfy them), so it sits below both layers."""
