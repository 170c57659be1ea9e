"""How `rlconf tune` shows its result: the knobs it moved and why, and the estimated peak per pool and phase."""

from __future__ import annotations

import json
from typing import Any

from rlconf.tune import SAFETY, TuneResult, _yaml


# The "why" column's least useful width: narrower, a table folds reasons word by word and values digit by digit.
WHY_MIN_WIDTH = 32


def tune_renderable(result: TuneResult, width: int | None = None) -> Any:
    """`width`: the console's columns. Where the knobs table would not fit them with a readable "why" (80 columns,
    rich's width for a pipe or a log, cannot hold a 59-character key beside it), each knob is a line of its own,
    its reason below it, nothing folded."""
    from rich import box
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    parts: list[Any] = [Text(f"GPU: {result.gpu_memory_gib:g} GiB ({result.gpu_source}); a plan fits when its "
                             f"estimate × {SAFETY} stays within it: at most {result.limit_gib:.1f} GiB per GPU")]
    if result.throughput_note:
        parts.append(Text(result.throughput_note))
    rows = [(c.key, _yaml(c.before), _yaml(c.after), c.why) for c in result.changes]
    if not rows:
        parts.append(Text("knobs: nothing to change: the plan already follows the guide"))
    elif width is not None and _table_width(rows) + WHY_MIN_WIDTH > width:
        parts.append(Text("knobs\n" + "\n".join(f"  {key}: {before} → {after}\n      {why}"
                                                 for key, before, after, why in rows)))
    else:
        knobs = Table(title="knobs", title_justify="left", box=box.SIMPLE_HEAD)
        for header in HEADERS[:3]:  # a dotted key or a value cut in two cannot be pasted back
            knobs.add_column(header, no_wrap=True)
        knobs.add_column(HEADERS[3], overflow="fold")
        for row in rows:
            knobs.add_row(*row)
        parts.append(knobs)
    if result.considered:
        parts.append(Text("weighed and left as they are:\n" + "\n".join(
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


HEADERS = ("knob", "before", "after", "why")


def _table_width(rows: list[tuple[str, str, str, str]]) -> int:
    """Columns the knobs table's key, before and after take, headers included, with the table's padding (one
    space each side of every column, SIMPLE_HEAD's edges): the reasons aside."""
    return sum(max(len(HEADERS[i]), *(len(row[i]) for row in rows)) for i in range(3)) + 2 * len(HEADERS) + 2


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
