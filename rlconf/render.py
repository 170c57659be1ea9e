"""Rendering for people: compiler-style diagnostics and the `explain` tables (rich).

Nothing here computes a number; it only lays out what the compiler returned.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from rlconf.diagnostics import Diagnostic, Severity
from rlconf.sources import Location, SourceMap
from rlconf.paths import shorten

if TYPE_CHECKING:  # rich is imported only where it prints: `validate` into a pipe never needs it
    from rich.console import Console, Group
    from rich.table import Table
    from rich.text import Text

    from rlconf.resolved import ForwardRole, ResolvedPlan, TrainRole

STYLE = {Severity.ERROR: "bold red", Severity.WARNING: "bold yellow"}
SHOWN_LINE_CHARS = 120  # a longer source line is cut there

# Diagnostics are laid out as pieces of text, each with the rich style it prints in (None: plain),
# so that one layout prints through rich on a terminal and as plain text elsewhere.
Piece = tuple[str, "str | None"]


def diagnostic_pieces(d: Diagnostic, sources: SourceMap) -> list[Piece]:
    """error[RL204]: message / --> file:line:col / source line with a caret / = help: ..."""
    out: list[Piece] = [(f"{d.severity.value}[{d.code}]", STYLE[d.severity]), (f": {d.message}\n", "bold")]
    loc = d.location
    line = sources.source_line(loc) if loc else None
    related_line = sources.source_line(d.related) if d.related else None
    if related_line is not None and loc is not None and d.related.file != loc.file:
        related_line = None  # another file: named in a note instead of a second snippet
    if related_line is not None and not _fits(d.related):
        related_line = None  # its column is past the cut: named in a note
    numbers = [str(x.line) for x, text in ((loc, line), (d.related, related_line)) if text is not None and x and x.line]
    gutter = " " * max(map(len, numbers), default=1)
    if loc is not None:
        out += [(f"{gutter} --> ", "bold blue"), (f"{loc}\n", None)]
    # The related place is shown in source order with the primary one (as rustc does).
    related_first = related_line is not None and loc is not None and (d.related.line or 0) < (loc.line or 0)
    if related_first:
        out += _snippet(gutter, d.related, related_line, d.related_note, "bold blue")
    if line is not None and loc is not None and loc.line and _fits(loc):
        out += _snippet(gutter, loc, line, d.note, STYLE[d.severity])
    elif d.note:
        out += [(f"{gutter} = ", "bold blue"), (f"note: {d.note}\n", None)]
    if d.related is not None and related_line is not None:
        if not related_first:
            out += _snippet(gutter, d.related, related_line, d.related_note, "bold blue")
    elif d.related is not None:
        out += [(f"{gutter} = ", "bold blue"), (f"note: {d.related_note} ({d.related})\n", None)]
    if d.help:
        out += [(f"{gutter} = ", "bold blue"), ("help: ", "bold"), (f"{d.help}\n", None)]
    return out


def _fits(loc: Location) -> bool:
    """The place starts inside the part of its line that is shown (a snippet whose caret would sit past
    the cut is left out; the location line and the note still name the place)."""
    return max((loc.col or 1) - 1, 0) < SHOWN_LINE_CHARS


def _snippet(gutter: str, loc: Location, line: str, label: str | None, style: str) -> list[Piece]:
    """`  |` / `3 | the source line` / `  |     ^^^ label`"""
    start = max((loc.col or 1) - 1, 0)
    width = max((loc.end_col or start + 2) - 1 - start, 1)
    line = line.rstrip()
    if len(line) > SHOWN_LINE_CHARS:  # a value thousands of characters long: show its start
        line = line[:SHOWN_LINE_CHARS] + f"… ({len(line)} characters)"
        width = max(min(width, SHOWN_LINE_CHARS - start), 1)
    out: list[Piece] = [(f"{gutter} |\n", "bold blue"), (f"{loc.line:>{len(gutter)}} | ", "bold blue"),
                        (line + "\n", None), (f"{gutter} | ", "bold blue"), (" " * start + "^" * width, style)]
    if label:
        out.append((f" {label}", style))
    out.append(("\n", None))
    return out


def summary_piece(path: str, diagnostics: list[Diagnostic]) -> Piece:
    errors = sum(d.is_error for d in diagnostics)
    warnings = len(diagnostics) - errors
    parts = []
    if errors:
        parts.append(f"{errors} error{'s' * (errors != 1)}")
    if warnings:
        parts.append(f"{warnings} warning{'s' * (warnings != 1)}")
    if errors:
        return f"✗ {shorten(path)}: {', '.join(parts)}", "bold red"
    tail = f" ({', '.join(parts)})" if parts else ""
    return f"✓ {shorten(path)} is valid{tail}", "bold green"


def ordered(diagnostics: list[Diagnostic]) -> list[Diagnostic]:
    """Errors first, then by line."""
    return sorted(diagnostics, key=lambda d: (not d.is_error, d.location.line if d.location and d.location.line else 0))


def diagnostic_text(d: Diagnostic, sources: SourceMap) -> Text:
    from rich.text import Text

    out = Text()
    for text, style in diagnostic_pieces(d, sources):
        out.append(text, style=style)
    return out


def summary_text(path: str, diagnostics: list[Diagnostic]) -> Text:
    from rich.text import Text

    text, style = summary_piece(path, diagnostics)
    return Text(text, style=style)


def print_diagnostics(console: Console, diagnostics: list[Diagnostic], sources: SourceMap) -> None:
    for d in ordered(diagnostics):
        console.print(diagnostic_text(d, sources))


# Characters rich's Text drops (rich.control.strip_control_codes): bell, backspace, vertical tab,
# form feed, carriage return.
_RICH_STRIPS = dict.fromkeys((7, 8, 11, 12, 13))


def plain_report(path: str, diagnostics: list[Diagnostic], sources: SourceMap) -> str | None:
    """What print_diagnostics and the summary print through rich when rich styles nothing (output
    to a pipe or a file), without importing rich; None where rich would lay the text out itself
    (a tab to expand, a line ending in whitespace that it may trim): print through rich then.
    tests/compiler/test_cli.py checks the two agree."""
    blocks = ["".join(text for text, _ in diagnostic_pieces(d, sources)) for d in ordered(diagnostics)]
    blocks.append(summary_piece(path, diagnostics)[0])
    report = "".join(block + "\n" for block in blocks).translate(_RICH_STRIPS)
    if "\t" in report or any(line != line.rstrip() for line in report.split("\n")):
        return None
    return report


# --- explain ----------------------------------------------------------------------------------

# The fully async schedule's last clause: what a weight push does to the calls the pool is generating.
PARTIAL_ROLLOUT = ("a push interrupts the pool's calls, whose unfinished responses resume on the new weights "
                   "(partial_rollout: a response's tokens may come from several versions; its group's staleness "
                   "counts from the first)")
WHOLE_ROLLOUT = "a push waits for the calls the pool is generating, which finish on their weights (partial_rollout false)"


TRAIN_ROWS = [
    ("dp_size", "data-parallel ranks"),
    ("sequences_per_gpu", "sequences per GPU per step"),
    ("ppo_mini_batch_size_per_gpu", "mini batch per GPU"),
    ("ppo_micro_batch_size_per_gpu", "micro batch per GPU"),
    ("grad_accum_steps", "gradient accumulation steps"),
    ("mini_batches_per_epoch", "mini batches per epoch"),
    ("optimizer_steps_per_train_step", "optimizer steps per train step"),
    ("max_token_len_per_gpu", "token budget per GPU"),
    ("tokens_per_micro_batch", "tokens per micro batch (× sp)"),
]
FORWARD_ROWS = [
    ("dp_size", "data-parallel ranks"),
    ("sequences_per_gpu", "sequences per GPU per step"),
    ("micro_batch_size_per_gpu", "micro batch per GPU"),
    ("micro_batches_per_gpu", "forward micro batches per GPU"),
    ("max_token_len_per_gpu", "token budget per GPU"),
    ("tokens_per_micro_batch", "tokens per micro batch (× sp)"),
]


def _role_table(title: str, role: TrainRole | ForwardRole, rows: list[tuple[str, str]]) -> Table:
    from rich.table import Table

    table = Table(title=title, title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("per GPU")
    table.add_column("value", justify="right", style="cyan")
    table.add_column("from", style="dim")
    dynamic = role.use_dynamic_bsz
    for field, label in rows:
        value = getattr(role, field)
        if dynamic and field in {"ppo_micro_batch_size_per_gpu", "grad_accum_steps", "micro_batch_size_per_gpu", "micro_batches_per_gpu"}:
            table.add_row(label, "dynamic", "use_dynamic_bsz: packed by token budget")
            continue
        if not dynamic and field in {"max_token_len_per_gpu", "tokens_per_micro_batch"}:
            continue
        table.add_row(label, "-" if value is None else str(value), role.formulas.get(field, ""))
    return table


def explain_renderable(plan: ResolvedPlan) -> Group:
    from rich.console import Group
    from rich.table import Table
    from rich.text import Text

    from rlconf.estimate import params_text

    w = plan.world
    world = f"{w.nnodes} node(s) × {w.gpus_per_node} {w.device.upper()} devices = {w.world_size}"
    if plan.schedule.total_gpus > w.world_size:  # verl's keys: trainer.* are the training GPUs, other pools on top
        served = plan.roles.served_reward_model
        others = ([f"{plan.schedule.rollout_gpus} of the rollout pool"] if plan.schedule.off_policy else []) + \
                 ([f"{served.world_size} of the reward model's pool"] if served is not None and not served.colocated else [])
        world += f" training + {' + '.join(others)} = {plan.schedule.total_gpus} in all"
    parts: list = [Text.assemble(("world  ", "bold"), world)]
    model = plan.model
    where = model.info_text or f"from {model.info_source}"
    size = f"{params_text(model.num_params)} params, {where}" if model.num_params else "size unknown"
    parts.append(Text.assemble(("model  ", "bold"), f"{model.path}  [{size}]"))
    pools = Table(title="placement", title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    pools.add_column("pool")
    pools.add_column("GPUs", justify="right", style="cyan")
    pools.add_column("roles")
    for name, pool in plan.placement.pools.items():
        pools.add_row(name, f"{pool.nnodes} × {pool.gpus_per_node} = {pool.gpus}", ", ".join(pool.roles) or "(idle)")
    parts += [Text(), pools]
    sched = plan.schedule
    if sched.fully_async:
        parts += [Text(), Text.assemble(
            ("schedule  ", "bold"), f"fully async: {sched.rollout_gpus} {w.device.upper()} device(s) of pool "
            f"`{plan.roles.rollout.pool}` stream groups as they finish, at most {sched.replica_window} in a "
            "replica's engine at once, while "
            f"{sched.trainer_gpus} of pool `{plan.roles.actor.pool}` train, taking {sched.groups_per_step} groups a "
            f"step; weights go trainer → rollout every {sched.sync_every} step(s) over {sched.weight_sync} in "
            f"buckets of at most {sched.bucket_megabytes} MB; at most {sched.max_groups_per_version} groups start per "
            f"weight version, so a trained group is at most {sched.max_staleness} step(s) behind the weights it "
            "trains; " + (PARTIAL_ROLLOUT if sched.partial_rollout else WHOLE_ROLLOUT),
            ("  (" + sched.why + ")", "dim"))]
        for key in ("groups_per_step", "replica_window", "max_groups_per_version", "max_staleness"):
            parts.append(Text(f"  {key}: {sched.formulas[key]}", style="dim"))
    elif sched.off_policy:
        parts += [Text(), Text.assemble(
            ("schedule  ", "bold"), f"one-step off-policy: {sched.rollout_gpus} {w.device.upper()} device(s) of pool "
            f"`{plan.roles.rollout.pool}` generate step k+1's batch while {sched.trainer_gpus} of pool "
            f"`{plan.roles.actor.pool}` train step k on a batch at most {sched.max_staleness} weight version old; "
            f"weights go trainer → rollout over {sched.weight_sync} in buckets of at most {sched.bucket_megabytes} MB",
            ("  (" + sched.why + ")", "dim"))]

    r = plan.roles.rollout
    rollout = Table(title=f"rollout ({r.backend}, pool {r.pool})", title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    rollout.add_column("")
    rollout.add_column("value", justify="right", style="cyan")
    rollout.add_column("from", style="dim")
    for field, label in [("replicas", "replicas (GPUs ÷ tensor parallel)"), ("sequences_per_step", "sequences per step"),
                         ("prompts_per_generation", "prompts per generation round"),
                         ("sequences_per_replica", "sequences per replica per round"), ("max_model_len", "max model length")]:
        rollout.add_row(label, str(getattr(r, field)), r.formulas.get(field, ""))
    rollout.add_row("tensor parallel size", str(r.tensor_parallel_size), "")
    if r.backend == "vllm":
        rollout.add_row("gpu_memory_utilization", f"{r.gpu_memory_utilization:g}", "")
        rollout.add_row("max_num_seqs / max_num_batched_tokens", f"{r.max_num_seqs} / {r.max_num_batched_tokens}", "")
        executor = plan.config.actor_rollout_ref.rollout.engine_kwargs.vllm.get("distributed_executor_backend")
        rollout.add_row("vLLM's processes", "its own (mp)" if executor == "mp" else "the actor worker's",
                        "engine core and model runner beside the worker on its GPU; weights by CUDA IPC" if executor == "mp"
                        else "engine core and model in the worker's thread (external_launcher); weights in place")
    rollout.add_row("sampled tokens' log-probs", "returned" if r.log_probs else "not returned", r.log_probs_why)
    parts += [Text(), rollout]
    parts += [Text(), _role_table(f"actor update (pool {plan.roles.actor.pool})", plan.roles.actor, TRAIN_ROWS)]
    if r.old_log_probs == "recompute":
        parts += [Text(), _role_table("old log-probs (actor model, forward only)", r.log_prob, FORWARD_ROWS)]
    else:
        source = "the update's own forward" if r.old_log_probs == "update" else "the rollout engine"
        parts += [Text(), Text.assemble(("old log-probs", "bold"), f": from {source}, no separate pass (",
                                        (r.old_log_probs_why, "dim"), ")")]
    if plan.roles.ref:
        parts += [Text(), _role_table(f"reference log-probs (pool {plan.roles.ref.pool})", plan.roles.ref, FORWARD_ROWS)]
    if plan.roles.critic:
        parts += [Text(), _role_table(f"critic update (pool {plan.roles.critic.pool})", plan.roles.critic, TRAIN_ROWS)]
    if plan.roles.critic_values:
        parts += [Text(), _role_table("critic values (forward only)", plan.roles.critic_values, FORWARD_ROWS)]
    if plan.roles.reward_model:
        parts += [Text(), _role_table(f"reward model (pool {plan.roles.reward_model.pool})", plan.roles.reward_model, FORWARD_ROWS)]
    if plan.roles.served_reward_model:
        parts += [Text(), _served_reward_model_table(plan.roles.served_reward_model)]
    if plan.reward is not None:
        parts += [Text(), Text.assemble(("reward  ", "bold"), plan.reward.text)]
    parts += [Text(), _memory_table(plan)]
    host = _host_memory_line(plan)
    if host is not None:
        parts += [Text(), host]
    return Group(*parts)


def _host_memory_line(plan: ResolvedPlan):
    """What offloaded states hold of the machines' memory (rlconf.host_memory), where the plan offloads any."""
    from rich.text import Text

    from rlconf.host_memory import GIB, host_need

    need = host_need(plan)
    if need is None or not need.training:
        return None
    parts = ", ".join(f"{what} {nbytes / GIB:.1f}" for what, nbytes in need.training.items())
    nodes = plan.world.nnodes
    where = f"the run's {nodes} machines together (about {need.training_total / nodes / GIB:.1f} GiB each)" if nodes > 1 \
        else "the machine"
    return Text.assemble(("host memory  ", "bold"),
                         f"the offloaded states hold {need.training_total / GIB:.1f} GiB of {where} while training "
                         f"({parts} GiB; page-locked on a GPU); at the end-of-run export rank 0's machine also gathers "
                         f"the actor's full fp32 weights ({need.gathered / GIB:.1f} GiB), once the "
                         "optimizer's moments are released")


def _served_reward_model_table(s) -> Table:
    from rich.table import Table

    where = "colocated with the actor" if s.colocated else "its own pool"
    table = Table(title=f"reward model served by {s.backend} (reward loop, pool {s.pool}: {where})", title_justify="left",
                  title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("")
    table.add_column("value", justify="right", style="cyan")
    table.add_column("from", style="dim")
    table.add_row("GPUs", str(s.world_size), s.formulas.get("world_size", ""))
    table.add_row("replicas (GPUs ÷ tensor parallel)", str(s.replicas), s.formulas.get("replicas", ""))
    table.add_row("gpu_memory_utilization", f"{s.gpu_memory_utilization:g}", "reward_model.rollout.gpu_memory_utilization")
    table.add_row("asleep except while scoring", "yes" if s.free_cache_engine else "no",
                  "reward_model.rollout.free_cache_engine")
    table.add_row("max model length", "model's" if s.max_model_len is None else str(s.max_model_len),
                  "null: the model's max_position_embeddings" if s.max_model_len is None else "")
    return table


def gib_text(gib: float) -> str:
    """GiB with one decimal; small amounts (a tiny CPU model) in MiB rather than a flat 0.0."""
    if gib == 0 or gib >= 0.1:
        return f"{gib:.1f} GiB"
    return f"{gib * 1024:.1f} MiB"


def _memory_table(plan: ResolvedPlan):
    from rich.table import Table
    from rich.text import Text

    if not plan.memory:
        return Text("memory  unknown: set estimate.num_params_b, or point model.path at a local HF directory", style="dim")
    table = Table(title="memory per GPU (estimate)", title_justify="left", title_style="bold", show_edge=False, pad_edge=False)
    table.add_column("pool / phase")
    table.add_column("term")
    table.add_column("size", justify="right", style="cyan")
    table.add_column("from", style="dim")
    for phase in plan.memory:
        label = f"{phase.pool} / {phase.phase}"
        for term in phase.terms:
            table.add_row(label, term.what, gib_text(term.gib), term.formula)
            label = ""
        over = phase.total_gib > phase.gpu_memory_gib
        table.add_row("", Text("total", style="bold"), Text(gib_text(phase.total_gib), style="bold red" if over else "bold"),
                      f"of {phase.gpu_memory_gib:g} GiB per GPU", end_section=True)
    return table
