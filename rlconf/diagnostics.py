"""Diagnostics: what the compiler tells a person about their plan.

A diagnostic is data (code, severity, key, location, message, help); rendering
lives in `rlconf.render`. Codes are stable and documented in docs/rules.md.
"""

from __future__ import annotations

from enum import Enum
from typing import NamedTuple

from rlconf.sources import Location, SourceMap


class Severity(str, Enum):
    ERROR = "error"
    WARNING = "warning"


class Diagnostic(NamedTuple):
    code: str
    severity: Severity
    key: str  # dotted path, e.g. actor_rollout_ref.actor.ppo_mini_batch_size ("" for the whole file)
    message: str
    help: str | None = None
    # One line shown under the caret: the arithmetic behind the message.
    note: str | None = None
    location: Location | None = None
    # A second place the message refers to (where an unclosed `[` began, the first of two duplicate
    # keys), with the words shown under its caret. Absent from JSON when not set.
    related: Location | None = None
    related_note: str | None = None

    @property
    def is_error(self) -> bool:
        return self.severity is Severity.ERROR

    def at(self, location: Location | None) -> Diagnostic:
        return self._replace(location=location)

    def also(self, location: Location, note: str) -> Diagnostic:
        return self._replace(related=location, related_note=note)

    def to_json(self) -> dict:
        data = self._asdict()  # location and related become their text below
        data["severity"] = self.severity.value
        data["location"] = str(self.location) if self.location else None
        if self.related is None:
            del data["related"], data["related_note"]
        else:
            data["related"] = str(self.related)
        return data


def error(code: str, key: str, message: str, help: str | None = None, note: str | None = None) -> Diagnostic:
    return Diagnostic(code, Severity.ERROR, key, message, help, note)


def warning(code: str, key: str, message: str, help: str | None = None, note: str | None = None) -> Diagnostic:
    return Diagnostic(code, Severity.WARNING, key, message, help, note)


class PlanInputError(Exception):
    """Input that cannot be read as a plan at all (exit code 2) or a broken `base:` chain."""

    def __init__(self, diagnostic: Diagnostic, exit_code: int = 2):
        super().__init__(diagnostic.message)
        self.diagnostic = diagnostic
        self.exit_code = exit_code
        self.sources: SourceMap | None = None  # the file's lines, when the loader got as far as reading it
