"""The simulated engine's error tree; the gRPC edge maps each to one status code."""

from __future__ import annotations


class SimError(Exception):
    """Base of every error the simulated engine raises on purpose."""


class ModelFolderError(SimError):
    """The model folder is missing, unreadable or lacks a field the engine needs."""


class InvalidRequestError(SimError):
    """The request cannot be served as sent (the gRPC edge answers INVALID_ARGUMENT)."""


class EngineClosedError(SimError):
    """The engine is shutting down and takes no new work (the edge answers UNAVAILABLE)."""
