"""The API adapters this node serves. Adding an API (e.g. Anthropic Messages) is one module with an adapter
class and one line here; nothing else changes: build_app registers each adapter's routes and its error
envelope."""

from __future__ import annotations

from node.http.adapter import AdapterFactory
from node.http.anthropic_messages import Messages
from node.http.openai_chat import ChatCompletions
from node.http.openai_completions import Completions
from node.http.openai_conversations import Conversations
from node.http.openai_responses import Responses

ADAPTERS: tuple[AdapterFactory, ...] = (
    ChatCompletions,
    Completions,
    Responses,
    Conversations,
    Messages,
)
