"""Chat templates: Hugging Face-compatible Jinja rendering of a conversation into one prompt string.

A model folder's ``chat_template`` is written for ``transformers``' ``apply_chat_template``, so rendering must
match its semantics exactly or prompts drift from what the model was trained on: an immutable sandbox,
``trim_blocks``/``lstrip_blocks``, the ``loopcontrols`` extension, a ``tojson`` filter that does not
HTML-escape, and the ``raise_exception``/``strftime_now`` globals. The special-token strings are passed as
template variables (``bos_token``, ``eos_token``) the way transformers passes its special-tokens map.

Every failure the template or the request can cause surfaces as `TemplateError` with a message meant for the
API caller; the HTTP edge turns it into a 400.

jinja2 here is the reference. Where minijinja renders a template and a request the same way
(`node.pipeline.template_fast`), it renders instead, 2.5–4.5 times faster for the templates we ship; the
reference renders the rest and every error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, Final

import jinja2
import minijinja
from jinja2.ext import loopcontrols
from jinja2.sandbox import ImmutableSandboxedEnvironment

from node.pipeline.template_fast import PROBES, FastTemplate, fast_context

# Variables the renderer owns; letting caller-supplied extras replace them would break the invariants the
# pipeline relies on (e.g. exactly one BOS, produced by the template).
RESERVED_VARIABLES: Final = frozenset(
    {"messages", "tools", "documents", "add_generation_prompt", "bos_token", "eos_token"}
)


class TemplateError(Exception):
    """The chat template cannot render this request; ``message`` is safe to show the API caller."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message


class _RaisedByTemplate(jinja2.TemplateError):
    """``raise_exception(...)`` called by the template author: the message is already user-facing."""


def _raise_exception(message: str) -> None:
    raise _RaisedByTemplate(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | str | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # Jinja's built-in tojson HTML-escapes '<', '>', '&' and "'"; transformers replaces it with plain
    # json.dumps so tool schemas reach the model verbatim. Same defaults and keyword names as theirs.
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


class ChatTemplate:
    """One chat template, compiled once and rendered many times (rendering is thread-safe).

    ``now`` supplies the wall clock for ``strftime_now``; inject a fixed clock for deterministic output.
    """

    __slots__ = ("_bos_token", "_eos_token", "_fast", "_template", "source")

    def __init__(
        self,
        source: str,
        *,
        bos_token: str | None,
        eos_token: str | None,
        now: Callable[[], datetime] = datetime.now,
        fast: bool = True,
    ) -> None:
        """Compile ``source``; with ``fast``, also with minijinja where it renders as jinja2 (module docstring).

        Raises:
            TemplateError: the template has a syntax error (the message names the line).
        """

        def strftime_now(fmt: str) -> str:
            return now().strftime(fmt)

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = strftime_now
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateSyntaxError as exc:
            raise TemplateError(f"chat template syntax error at line {exc.lineno}: {exc.message}") from exc
        self.source = source
        self._bos_token = bos_token
        self._eos_token = eos_token
        self._fast: FastTemplate | None = None
        if not fast:
            return
        try:
            compiled = FastTemplate(source, tojson=_tojson, raise_exception=_raise_exception, strftime_now=strftime_now)
        except minijinja.TemplateError:
            return  # minijinja cannot parse it: the reference renders everything
        if all(self._agree(compiled, *probe) for probe in PROBES):
            self._fast = compiled

    @property
    def engine(self) -> str:
        """Which engine renders requests whose values it supports: "minijinja" or "jinja2"."""
        return "jinja2" if self._fast is None else "minijinja"

    def _agree(
        self,
        fast: FastTemplate,
        messages: list[dict[str, Any]],
        tools: list[dict[str, Any]] | None,
        add_generation_prompt: bool,
        extra: dict[str, Any],
    ) -> bool:
        """Both engines give this probe the same text, or both fail on it."""
        variables = self._variables(messages, tools, add_generation_prompt, extra)
        try:
            expected: str | None = self._template.render(variables)
        except Exception:  # any failure: the fast engine must fail too
            expected = None
        context = fast_context(variables)
        if context is None:
            return False
        try:
            got: str | None = fast.render(context)
        except Exception:  # the probe disagrees
            got = None
        return got == expected

    def _variables(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None,
        add_generation_prompt: bool,
        extra: Mapping[str, Any] | None,
    ) -> dict[str, Any]:
        variables: dict[str, Any] = {}
        if extra:
            clash = sorted(RESERVED_VARIABLES.intersection(extra))
            if clash:
                raise TemplateError(f"chat template arguments may not override {', '.join(clash)}")
            variables.update(extra)
        # transformers passes only the special tokens that are set; an unset one is undefined, not None.
        if self._bos_token is not None:
            variables["bos_token"] = self._bos_token
        if self._eos_token is not None:
            variables["eos_token"] = self._eos_token
        variables["messages"] = list(messages)
        variables["tools"] = list(tools) if tools is not None else None
        variables["documents"] = None
        variables["add_generation_prompt"] = add_generation_prompt
        return variables

    def render(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        extra: Mapping[str, Any] | None = None,
    ) -> str:
        """Render ``messages`` (and ``tools``, JSON schemas) into the prompt text.

        ``extra`` carries template-specific switches (``chat_template_kwargs``); it may not override
        `RESERVED_VARIABLES`.

        Raises:
            TemplateError: the template rejected the conversation (``raise_exception``), referenced
                something the request lacks, or failed on malformed message content.
        """
        variables = self._variables(messages, tools, add_generation_prompt, extra)
        fast = self._fast
        if fast is not None:
            context = fast_context(variables)
            if context is not None:
                try:
                    return fast.render(context)
                except Exception:  # the reference renders it again and decides
                    pass
        try:
            return self._template.render(variables)
        except _RaisedByTemplate as exc:
            raise TemplateError(str(exc)) from exc
        except jinja2.TemplateError as exc:  # undefined values, sandbox violations
            raise TemplateError(f"chat template failed to render the request: {exc}") from exc
        except (TypeError, ValueError, LookupError, AttributeError) as exc:
            # Raised from inside the template on content of the wrong shape, e.g. a number where text
            # was expected; the request, not the server, is at fault.
            raise TemplateError(f"chat template failed to render the request: {exc}") from exc
