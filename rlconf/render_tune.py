"""How `rlconf tune` shows its result: the knobs it moved and why, and the estimated peak per pool and phase."""

from __future__ import annotations

import json
from typing import Any

from rlconf.tune import SAFETY, TuneResult, _yaml


def tune_renderable(result: TuneResult) -> Any:
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(f"GPU: {result.gpu_memory_gib:g} GiB ({result.gpu_source}); a plan fits when its "
                             f"estimate × {SAFETY} stays within it: at most {result.limit_gib:.1f} GiB per GPU")]
    if result.throughput_note:
        parts.append(Text(result.throughput_note))
    knobs = Table(title="knobs", title_justify="left", box=box.SIMPLE_HEAD)
    knobs.add_column("knob", no_wrap=True)  # a dotted key cut in two cannot be pasted back
    for column in ("before", "after", "why"):
        knobs.add_column(column, overflow="fold")
    for change in result.changes:
        knobs.add_row(change.key, _yaml(change.before), _yaml(change.after), change.why)
    parts.append(knobs if result.changes else Text("knobs: nothing to change: the plan already follows the guide"))
    if result.considered:
        parts.append(Text("weighed by the throughput model and left as they are:\n" + "\n".join(
            f"  {c.key}={_yaml(c.value)}: {c.why}" for c in result.considered)))
    memory = Table(title="estimated peak per GPU", title_justify="left", box=box.SIMPLE_HEAD)
    for column in ("pool / phase", "before", "after"):
        memory.add_column(column, justify="left" if column.startswith("pool") else "right")
    after = {(p.pool, p.phase): p.total_gib for p in result.after.resolved.memory} if _resolved(result) else {}
    for phase in result.before.resolved.memory:
        now = after.get((phase.pool, phase.phase))
        memory.add_row(f"{phase.pool} / {phase.phase}", f"{phase.total_gib:.1f} GiB",
                       "—" if now is None else f"{now:.1f} GiB")
    parts.append(memory)
    if result.why_not:
        parts.append(Text(f"does not fit: {result.why_not}", style="bold red"))
    return Group(*parts)


def _resolved(result: TuneResult) -> bool:
    return result.after is not None and result.after.resolved is not None


def tune_json(result: TuneResult) -> str:
    def phases(compiled) -> list[dict[str, Any]]:
        if compiled is None or compiled.resolved is None:
            return []
        return [{"pool": p.pool, "phase": p.phase, "total_gib": p.total_gib} for p in compiled.resolved.memory]

    return json.dumps({
        "gpu_memory_gib": result.gpu_memory_gib, "gpu_source": result.gpu_source, "limit_gib": result.limit_gib,
        "safety": SAFETY, "fits": result.fits, "why_not": result.why_not,
        "throughput_model": {"state": result.throughput_state, "note": result.throughput_note},
        "changes": [{"key": c.key, "before": c.before, "after": c.after, "why": c.why} for c in result.changes],
        "considered": [{"key": c.key, "value": c.value, "why": c.why} for c in result.considered],
        "overrides": result.overrides, "before": phases(result.before), "after": phases(result.after),
        "diagnostics": [d.to_json() for d in (result.after.diagnostics if result.after else result.before.diagnostics)],
    }, indent=2)
