"""Errors that end a run with a message for people, importable before torch is (the launch catches them)."""

from __future__ import annotations


class NonFiniteError(RuntimeError):
    """A loss or gradient norm became NaN/inf; the run stops rather than train on garbage."""
