"""Streaming parsers for model output: reasoning and tool calls (pure cores; see events.py)."""
