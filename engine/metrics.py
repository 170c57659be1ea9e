"""Per-step metrics: one JSON object per line in metrics.jsonl, and a compact console line."""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

# (metric, label, format) shown on the console line; everything goes to metrics.jsonl.
CONSOLE_FIELDS: tuple[tuple[str, str, str], ...] = (
    ("reward/mean", "reward", "{:.3f}"),
    ("val/reward/mean", "val", "{:.3f}"),
    ("response_length/mean", "len", "{:.1f}"),
    ("actor/entropy", "ent", "{:.3f}"),
    ("actor/pg_loss", "pg", "{:+.4f}"),
    ("actor/pg_clipfrac", "clip", "{:.3f}"),
    ("actor/grad_norm", "gnorm", "{:.3f}"),
    ("actor/lr", "lr", "{:.1e}"),
    ("perf/tokens_per_second", "tok/s", "{:.0f}"),
    ("timing/step", "s", "{:.2f}"),
)


class StageTimer:
    """Wall seconds per stage of a step, stored as timing/<stage>.

    `after(name)` runs when a stage has completed: the trainer passes its stop point there, so a
    Ctrl-C stops the run between stages, never inside one (engine.interrupt).
    """

    def __init__(self, after: Callable[[str], None] = lambda name: None) -> None:
        self.seconds: dict[str, float] = {}
        self.after = after

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        start = time.perf_counter()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - start
        self.after(name)

    def as_metrics(self) -> dict[str, float]:
        return {f"timing/{name}": value for name, value in self.seconds.items()}


class MetricsFile:
    """metrics.jsonl, always written; a metric sink like those of engine.loggers."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._file: TextIO = path.open("a", encoding="utf-8")

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        # `step` is part of the sink protocol; each line carries its step in `metrics` already.
        # Flushed every step so a crashed or interrupted run keeps its history.
        self._file.write(json.dumps(metrics, sort_keys=True) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def console_line(step: int, total: int, metrics: dict[str, Any]) -> str:
    parts = [f"step {step:>{len(str(total))}}/{total}"]
    for key, label, fmt in CONSOLE_FIELDS:
        if key in metrics:
            parts.append(f"{label} {fmt.format(metrics[key])}")
    return "  ".join(parts)


def first_non_finite(metrics: dict[str, Any], keys: tuple[str, ...]) -> str | None:
    for key in keys:
        value = metrics.get(key)
        if isinstance(value, float) and not math.isfinite(value):
            return key
    return None
