"""Where a plan's values were written: a file position or a command-line override, and the lines to show.

Below both the loader (which records positions as it reads) and the diagnostics (which point at
them), so neither imports the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

from rlconf.paths import shorten


class Location(NamedTuple):
    """Where a value came from: a YAML file position (1-based) or a command-line override."""

    file: str | None = None
    line: int | None = None
    col: int | None = None
    end_col: int | None = None
    override: str | None = None  # the `key=value` text, when set on the command line

    def __str__(self) -> str:
        if self.override is not None:
            return f"override `{shorten(self.override)}`"
        if self.file is None:
            return "<defaults>"
        if self.line is None:
            return self.file
        return f"{self.file}:{self.line}:{self.col or 1}"


@dataclass
class SourceMap:
    """Dotted key -> where its value was written; file -> its lines (for rendering carets)."""

    values: dict[str, Location] = field(default_factory=dict)
    keys: dict[str, Location] = field(default_factory=dict)
    lines: dict[str, list[str]] = field(default_factory=dict)

    def locate(self, key: str) -> Location | None:
        """The value's location, else the nearest enclosing key that was written somewhere."""
        if key in self.values:
            return self.values[key]
        if key.endswith("]") and "[" in key:  # a list item nobody wrote: point at the list
            return self.locate(key[: key.rindex("[")])
        probe = key.rpartition(".")[0]
        while probe:  # an unwritten key: point at the section it belongs in
            if probe in self.keys:
                return self.keys[probe]
            probe = probe.rpartition(".")[0]
        return None

    def locate_key(self, key: str) -> Location | None:
        return self.keys.get(key) or self.locate(key)

    def source_line(self, loc: Location) -> str | None:
        if loc.file is None or loc.line is None:
            return None
        lines = self.lines.get(loc.file)
        if not lines or loc.line > len(lines):
            return None
        return lines[loc.line - 1]

    def merge_from(self, other: SourceMap) -> None:
        self.values.update(other.values)
        self.keys.update(other.keys)
        self.lines.update(other.lines)
