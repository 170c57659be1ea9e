"""`rlconf` command line (typer): thin commands that call the compiler and render what it returns.

The console entry point is rlconf.cli:main, which runs plain `validate` and `explain` lines
without importing this module (and typer); their bodies live in rlconf.commands, shared by both."""

from __future__ import annotations

import sys
import time
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

from rlconf.commands import OutputFormat, make_console, run_explain, run_validate

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Validate, explain and launch RL post-training plans (PPO, GRPO; verl-compatible keys).")
presets_app = typer.Typer(no_args_is_help=False, add_completion=False, invoke_without_command=True,
                          help="List the bundled presets, or show one.")
app.add_typer(presets_app, name="presets")
data_app = typer.Typer(no_args_is_help=True, add_completion=False,
                       help="Make training data in verl's parquet schema: the synthetic task, or GSM8K from JSONL.")
app.add_typer(data_app, name="data")


PLAN = typer.Argument(..., help="The plan YAML file.", show_default=False)
OVERRIDES = typer.Argument(None, help="Dotted overrides, e.g. actor_rollout_ref.rollout.n=8", show_default=False)
FORMAT = typer.Option(OutputFormat.text, "--format", "-f", help="text for people, json for machines.")


def _error(message: str) -> None:
    """`error: message` on stderr; the message is escaped, so `rlconf[engine]` or a path stays as written."""
    from rich.markup import escape

    make_console(stderr=True).print(f"[bold red]error[/bold red]: {escape(message)}")


@app.command()
def validate(plan: Path = PLAN, overrides: Optional[list[str]] = OVERRIDES, format: OutputFormat = FORMAT,
             strict: bool = typer.Option(False, "--strict", help="Fail (exit 1) on warnings too.")) -> None:
    """Check a plan: exit 0 valid (warnings allowed), 1 errors, 2 unreadable input."""
    raise typer.Exit(run_validate(plan, overrides or [], format, strict))


@app.command()
def explain(plan: Path = PLAN, overrides: Optional[list[str]] = OVERRIDES, format: OutputFormat = FORMAT) -> None:
    """Show the resolved plan: world, placement, rollout replicas, per-GPU values with formulas, memory."""
    raise typer.Exit(run_explain(plan, overrides or [], format))


@app.command()
def launch(plan: Path = PLAN, overrides: Optional[list[str]] = OVERRIDES,
           run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Run directory; default trainer.default_local_dir."),
           address: Optional[str] = typer.Option(None, "--address", help="Join this Ray cluster instead of starting a local one."),
           dashboard: bool = typer.Option(False, "--dashboard", help="Start the Ray dashboard (local cluster only).")) -> None:
    """Compile the plan, write plan.resolved.json into the run directory and run it on Ray.

    Ctrl-C (or SIGTERM) stops the run after the stage in progress, a second one at once; exit 130 (143).
    """
    started = time.perf_counter()  # timing/startup_total counts from here
    from engine.interrupt import owned_signals

    console = make_console(stderr=True)
    # From here on the launch owns SIGINT and SIGTERM (engine.interrupt), before the compiler's imports; run_launch
    # keeps the same handlers.
    with owned_signals(notify=lambda message: console.print(message, style="bold yellow", markup=False)) as signals:
        try:
            from rlconf.compile import compile_plan
            from rlconf.render import print_diagnostics, summary_text

            result = compile_plan(plan, overrides or [])
            if result.resolved is None:
                print_diagnostics(console, result.diagnostics, result.sources)
                console.print(summary_text(str(plan), result.diagnostics))
                console.print("[bold red]not launching[/bold red]: fix the errors above first")
                raise typer.Exit(result.exit_code())
            try:
                from engine.launch import device_memory_override, run_launch
            except ImportError as exc:
                print_diagnostics(console, result.warnings, result.sources)
                _error(f"the engine is not installed ({exc}); "
                       "install it with `pip install 'rlconf[engine]'` (and a torch build for your machine)")
                raise typer.Exit(2) from None
            # On a local GPU the memory checks use the GPU the run is on, not the plan's estimate.gpu_memory_gib.
            from rlconf.device import local_gpu

            gpu = local_gpu() if address is None and result.resolved.world.device == "cuda" else None
            memory, note = device_memory_override(result.resolved, gpu)
            if memory is not None:
                from rich.markup import escape

                result = compile_plan(plan, [*(overrides or []), memory])
                console.print(f"note: {escape(note)}")
            print_diagnostics(console, result.warnings, result.sources)
            signals.stop_point("compiling the plan")
        except KeyboardInterrupt:
            console.print("[bold red]interrupted[/bold red]: not launching")
            raise typer.Exit(signals.exit_code(130)) from None
        code = run_launch(result.resolved, run_dir=run_dir, address=address, dashboard=dashboard, started=started)
    raise typer.Exit(code)


@app.command()
def tune(plan: Path = PLAN, overrides: Optional[list[str]] = OVERRIDES,
         gpu_memory: Optional[float] = typer.Option(None, "--gpu-memory", help="GiB of one GPU (default: this machine's "
                                                    "GPU if it has one, else the plan's estimate.gpu_memory_gib)."),
         objective: str = typer.Option("throughput", "--objective", help="throughput: the largest budgets that fit; "
                                       "memory: the guide's floors."),
         write: Optional[Path] = typer.Option(None, "--write", help="Write the tuned plan here (the plan as its base:, "
                                              "plus the tuned knobs)."),
         fixed_micro_batches: bool = typer.Option(False, "--fixed-micro-batches", help="Keep fixed micro batches "
                                                  "(no dynamic batch size): the largest that divide the mini batch."),
         format: OutputFormat = FORMAT) -> None:
    """The tuning guide as a search: the fastest per-GPU knobs that fit, the same training (exit 1: nothing fits)."""
    from rlconf.device import local_gpu
    from rlconf.render import print_diagnostics, summary_text
    from rlconf.render_tune import tune_json, tune_renderable
    from rlconf.tune import tune as run_tune
    from rlconf.tune import tuned_plan_yaml

    if objective not in ("throughput", "memory"):
        _error(f"--objective must be throughput or memory, not {objective!r}")
        raise typer.Exit(2)
    source = None
    if gpu_memory is None:
        gpu = local_gpu()  # nvidia-smi, never a CUDA import: tune stays as light as validate
        if gpu is not None:
            gpu_memory, source = round(gpu.memory_gib, 1), f"this machine's {gpu.name}"
    result = run_tune(plan, overrides or [], gpu_memory, source, objective,  # type: ignore[arg-type]
                      dynamic=not fixed_micro_batches)
    console = make_console()
    if result.before.resolved is None:
        print_diagnostics(console, result.before.diagnostics, result.before.sources)
        console.print(summary_text(str(plan), result.before.diagnostics))
        raise typer.Exit(result.before.exit_code())
    if format is OutputFormat.json:
        print(tune_json(result))
    else:
        console.print(tune_renderable(result, console.width))
        if result.after is not None and result.after.diagnostics:
            print_diagnostics(console, result.after.diagnostics, result.after.sources)
    if write is not None and result.fits:
        write.write_text(tuned_plan_yaml(plan, write, result, overrides or []))
        if format is OutputFormat.text:
            console.print(f"wrote {write} (rlconf validate {write} checks it; rlconf launch {write} runs it)",
                          markup=False)
    raise typer.Exit(0 if result.fits else 1)


@app.command()
def report(run_dir: Path = typer.Argument(..., help="A run directory (the one holding metrics.jsonl).",
                                          show_default=False),
           output: Optional[Path] = typer.Option(None, "--output", "-o",
                                                 help="Where to write the PNG; default RUN_DIR/report.png.")) -> None:
    """Plot a run's metrics.jsonl into RUN_DIR/report.png and print first/last/min/max of the key metrics."""
    from engine.report import REPORT_FILE, ReportError, read_run_metrics, render_png, summarize

    try:
        run = read_run_metrics(run_dir)
        png = render_png(run, output if output is not None else run_dir / REPORT_FILE)
    except ReportError as exc:
        _error(str(exc))
        raise typer.Exit(2) from None
    console = make_console()
    for note in run.notes:
        console.print(f"note: {note}", markup=False)
    console.print(_report_table(run, summarize(run)))
    console.print(f"wrote {png}", markup=False)


def _report_table(run, rows):
    from rich import box
    from rich.table import Table

    steps = [record["step"] for record in run.records]
    # No vertical rules, no edges: the widest rows (a 22-character key, four numbers
    # like -0.0007015) then fit 80 columns, so nothing is cut short in a plain terminal or a CI log.
    table = Table(title=f"{run.path}: steps {steps[0]}..{steps[-1]} ({len(steps)} lines)", title_justify="left",
                  box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False)
    table.add_column("metric", no_wrap=True)
    for name in ("steps", "first", "last", "min", "max"):
        table.add_column(name, justify="right", no_wrap=True)
    for row in rows:
        table.add_row(row.metric, str(row.steps),
                      *(f"{value:.4g}" for value in (row.first, row.last, row.minimum, row.maximum)))
    return table


class SyntheticTask(str, Enum):
    echo = "echo"


def _require_pyarrow() -> None:
    import importlib.util

    # Parquet is written with pyarrow, an engine dependency; a compiler-only install lacks it.
    if importlib.util.find_spec("pyarrow") is None:
        _error("writing parquet needs pyarrow; install it with `pip install 'rlconf[engine]'` (or `pip install pyarrow`)")
        raise typer.Exit(2)


def _refuse_to_overwrite(paths: list[Path]) -> None:
    existing = [str(p) for p in paths if p.exists()]
    if existing:
        verb = "exists" if len(existing) == 1 else "exist"
        _error(f"{' and '.join(existing)} already {verb}; pass --force to overwrite")
        raise typer.Exit(2)


@data_app.command("synthetic")
def data_synthetic(out_dir: Path = typer.Argument(..., help="Directory for train.parquet and val.parquet.",
                                                 show_default=False),
                   task: SyntheticTask = typer.Option(SyntheticTask.echo, "--task", help="Synthetic task."),
                   train_size: int = typer.Option(2048, "--train-size", min=1, help="Training prompts."),
                   val_size: int = typer.Option(64, "--val-size", min=1, help="Validation prompts."),
                   seed: int = typer.Option(0, "--seed", help="Seed of the training split; validation uses seed + 1."),
                   force: bool = typer.Option(False, "--force", help="Overwrite existing files.")) -> None:
    """Write the synthetic task's train.parquet and val.parquet into OUT_DIR."""
    from engine.data.synthetic import write_synthetic_splits

    _require_pyarrow()
    if not force:
        _refuse_to_overwrite([out_dir / "train.parquet", out_dir / "val.parquet"])
    paths = write_synthetic_splits(out_dir, train_size, val_size, seed)
    console = make_console()
    console.print(f"wrote {paths['train']} ({train_size} prompts) and {paths['val']} ({val_size} prompts), "
                  f"task {task.value}", markup=False)
    console.print(f"use them in a plan: data.train_files={paths['train']} data.val_files={paths['val']}",
                  markup=False)


@data_app.command("gsm8k")
def data_gsm8k(input_jsonl: Path = typer.Argument(..., metavar="INPUT.jsonl", show_default=False,
                                                  help='GSM8K JSONL: one {"question", "answer"} object a line.'),
               out_parquet: Path = typer.Argument(..., metavar="OUT.parquet", show_default=False,
                                                  help="The verl-schema parquet file to write."),
               split: str = typer.Option("train", "--split", help="Stored in extra_info.split (train or test)."),
               force: bool = typer.Option(False, "--force", help="Overwrite OUT.parquet if it exists.")) -> None:
    """Convert GSM8K JSONL (the openai/gsm8k release format) into verl-schema parquet, as verl's preprocessing does."""
    from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

    from engine.data.gsm8k import convert_gsm8k_jsonl

    if not input_jsonl.is_file():
        _error(f"GSM8K input not found: {input_jsonl}")
        raise typer.Exit(2)
    _require_pyarrow()
    if not force:
        _refuse_to_overwrite([out_parquet])
    columns = (TextColumn("[bold]converting"), BarColumn(), DownloadColumn(), TimeRemainingColumn())
    # On stderr, transient, and only on a terminal: stdout (and a CI log) keeps just the result line.
    bar_console = make_console(stderr=True)
    try:
        with Progress(*columns, console=bar_console, transient=True, disable=not bar_console.is_terminal) as progress:
            task = progress.add_task("gsm8k", total=input_jsonl.stat().st_size)
            rows = convert_gsm8k_jsonl(input_jsonl, out_parquet, split,
                                       progress=lambda size: progress.advance(task, size))
    except ValueError as exc:  # a malformed line: the message names file:line
        _error(str(exc))
        raise typer.Exit(2) from None
    make_console().print(f"wrote {out_parquet} ({rows} rows, split {split})", markup=False)


@presets_app.callback()
def presets_list(ctx: typer.Context) -> None:
    """List the bundled presets."""
    if ctx.invoked_subcommand is not None:
        return
    from rlconf.presets import list_presets

    console = make_console()
    for preset in list_presets():
        console.print(f"[bold]{preset.name:<22}[/bold] {preset.summary}")


@presets_app.command("show")
def presets_show(name: str = typer.Argument(..., help="Preset name (see `rlconf presets`).")) -> None:
    """Print a preset's YAML (copy it, or use `base: NAME` in your plan)."""
    from rlconf.presets import find_preset

    preset = find_preset(name)
    if preset is None:
        from rlconf.presets import list_presets

        names = ", ".join(p.name for p in list_presets())
        make_console(stderr=True).print(f"[bold red]error[/bold red]: no preset `{name}`; bundled: {names}")
        raise typer.Exit(2)
    sys.stdout.write(preset.path.read_text())
