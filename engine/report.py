"""`rlconf report RUN_DIR`: the curves of a run's metrics.jsonl in one PNG, and first/last/min/max per key metric.

Reads only metrics.jsonl (no torch, no Ray), so it works on a laptop with a run directory copied
from a cluster, and on a run that is still going or was interrupted: a half-written last line is
skipped with a note. A step that appears twice (a run resumed from a checkpoint logs the steps
after the checkpoint again) keeps its last line, the one on the trajectory that continued.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
REPORT_FILE = "report.png"

# (panel title, y label, metric keys drawn as lines); a panel with none of its keys logged is left out.
LINE_PANELS: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    ("reward", "mean reward", ("reward/mean", "val/reward/mean")),
    ("response length", "tokens", ("response_length/mean",)),
    ("policy loss", "loss", ("actor/pg_loss",)),
    ("KL", "nats per token", ("actor/ppo_kl", "actor/kl_loss", "kl_in_reward/kl")),
    ("entropy", "nats per token", ("actor/entropy",)),
    ("gradient norm", "L2 norm (before clipping)", ("actor/grad_norm", "critic/grad_norm")),
    ("value loss", "loss", ("critic/vf_loss",)),
    ("throughput", "tokens / s", ("perf/tokens_per_second",)),
)
# timing/* keys that are not stages of a step: the step total, and a part of weight_sync measured in the worker.
NOT_STAGES = frozenset({"timing/step", "timing/weight_sync_in_worker"})
# Stages in the order a step runs them (engine/trainer.py), so the stacked bands read bottom-up like a step.
STAGE_ORDER: tuple[str, ...] = ("data", "generate", "reward", "old_log_prob", "ref", "values", "adv", "update_critic",
                                "update_actor", "weight_sync", "validation")

# Rows of the summary table, in this order, where logged.
SUMMARY_KEYS: tuple[str, ...] = (
    "reward/mean", "val/reward/mean", "response_length/mean", "actor/pg_loss", "actor/ppo_kl", "actor/kl_loss",
    "actor/entropy", "actor/grad_norm", "critic/vf_loss", "critic/vf_explained_var", "perf/tokens_per_second",
    "timing/step",
)


class ReportError(Exception):
    """The run directory cannot be reported on (missing, no metrics, unreadable line); the message says why."""


@dataclass(frozen=True)
class RunMetrics:
    path: Path
    records: list[dict[str, Any]]  # one per step, sorted by step
    notes: list[str]  # what was tolerated while reading (a truncated last line)

    def series(self, key: str) -> tuple[list[int], list[float]]:
        """(steps, values) of a numeric metric, skipping steps that did not log it."""
        points = [(r["step"], float(r[key])) for r in self.records if _is_number(r.get(key))]
        return [p[0] for p in points], [p[1] for p in points]

    def keys(self) -> set[str]:
        return {key for record in self.records for key in record}


@dataclass(frozen=True)
class SummaryRow:
    metric: str
    steps: int
    first: float
    last: float
    minimum: float
    maximum: float


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def read_run_metrics(run_dir: Path) -> RunMetrics:
    """Parse RUN_DIR/metrics.jsonl; ReportError for a missing directory/file, an empty file or a bad line."""
    if not run_dir.exists():
        raise ReportError(f"run directory not found: {run_dir}")
    if not run_dir.is_dir():
        raise ReportError(f"{run_dir} is a file, not a run directory (give the directory that holds {METRICS_FILE})")
    path = run_dir / METRICS_FILE
    if not path.is_file():
        raise ReportError(f"no {METRICS_FILE} in {run_dir}: `rlconf launch` writes it there after the first step; "
                          "is this the run directory (--run-dir, or trainer.default_local_dir)?")
    lines = path.read_text(encoding="utf-8").splitlines()
    numbered = [(number, line) for number, line in enumerate(lines, start=1) if line.strip()]
    by_step: dict[int, dict[str, Any]] = {}
    notes: list[str] = []
    for position, (number, line) in enumerate(numbered):
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            if position == len(numbered) - 1:
                # The trainer flushes whole lines; a partial one means the run died (or is) mid-write.
                notes.append(f"skipped a truncated last line ({path.name}:{number}): the run was writing it")
                continue
            raise ReportError(f"{path}:{number}: not a JSON object ({exc.msg}); only the last line may be "
                              "truncated, so this file was edited or corrupted") from None
        if not isinstance(record, dict) or not isinstance(record.get("step"), int):
            raise ReportError(f"{path}:{number}: expected a JSON object with an integer \"step\", got {line[:80]!r}")
        by_step[record["step"]] = record
    if not by_step:
        raise ReportError(f"{path} has no metrics yet: the run has not finished a step")
    return RunMetrics(path, [by_step[step] for step in sorted(by_step)], notes)


def summarize(run: RunMetrics) -> list[SummaryRow]:
    rows = []
    for key in SUMMARY_KEYS:
        steps, values = run.series(key)
        finite = [v for v in values if math.isfinite(v)]
        if not finite:
            continue
        rows.append(SummaryRow(key, len(values), values[0], values[-1], min(finite), max(finite)))
    return rows


def stage_keys(run: RunMetrics) -> list[str]:
    """The logged timing/<stage> keys in step order; stages this report does not know go last, by name."""
    logged = {key for key in run.keys() if key.startswith("timing/") and key not in NOT_STAGES}
    rank = {f"timing/{stage}": i for i, stage in enumerate(STAGE_ORDER)}
    return sorted(logged, key=lambda key: (rank.get(key, len(rank)), key))


def render_png(run: RunMetrics, out_path: Path) -> Path:
    """Draw every panel with data (plus stacked stage timings) into one PNG; return its path."""
    try:
        import matplotlib
    except ImportError:
        raise ReportError("the report needs matplotlib: `pip install matplotlib` "
                          "(it comes with `pip install 'rlconf[engine]'`)") from None
    matplotlib.use("Agg")  # files only: no display on a cluster node or in CI
    import matplotlib.pyplot as plt

    panels = [(title, ylabel, [k for k in keys if run.series(k)[0]]) for title, ylabel, keys in LINE_PANELS]
    panels = [p for p in panels if p[2]]
    # Training steps only: a validation-only line (step 0, val_before_train) is not a step's time.
    timed = [r for r in run.records if _is_number(r.get("timing/step"))]
    stages = stage_keys(run) if timed else []
    count = len(panels) + (1 if stages else 0)
    if count == 0:
        raise ReportError(f"{run.path} has none of the metrics the report draws (reward, losses, timings)")
    columns = 2 if count > 1 else 1
    rows = -(-count // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(6.5 * columns, 3.2 * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax, (title, ylabel, keys) in zip(flat, panels):
        for key in keys:
            steps, values = run.series(key)
            # A metric logged on a few steps only (validation) gets markers so single points show.
            ax.plot(steps, values, label=key, marker="o" if len(steps) <= 20 else None, markersize=3)
        ax.set_title(title)
        ax.set_ylabel(ylabel)
        ax.legend(fontsize=7, loc="best")
    if stages:
        ax = flat[len(panels)]
        steps = [r["step"] for r in timed]
        layers = [[float(r[k]) if _is_number(r.get(k)) else 0.0 for r in timed] for k in stages]
        ax.stackplot(steps, layers, labels=[k.removeprefix("timing/") for k in stages])
        ax.set_title("time per stage (stacked)")
        ax.set_ylabel("seconds")
        ax.legend(fontsize=7, loc="upper left", ncol=2)
    for ax in flat[:count]:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    for ax in flat[count:]:
        ax.set_visible(False)
    first, last = run.records[0]["step"], run.records[-1]["step"]
    fig.suptitle(f"{run.path.parent}: steps {first}..{last}", fontsize=11)
    fig.tight_layout()
    out_path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out_path, dpi=110)
    plt.close(fig)
    return out_path
