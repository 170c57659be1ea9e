"""Bundled presets: the YAML files under presets/ (their first comment line is the summary)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from rlconf.loader import presets_dir


@dataclass(frozen=True)
class Preset:
    name: str
    path: Path
    summary: str


def _summary(path: Path) -> str:
    for line in path.read_text().splitlines():
        if line.startswith("#"):
            return line.lstrip("# ").strip()
        if line.strip():
            break
    return ""


def list_presets() -> list[Preset]:
    return [Preset(p.stem, p, _summary(p)) for p in sorted(presets_dir().glob("*.yaml"))]


def find_preset(name: str) -> Preset | None:
    return next((p for p in list_presets() if p.name == name), None)
