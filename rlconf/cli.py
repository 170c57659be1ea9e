"""`rlconf` command line: thin commands that call the compiler and render what it returns."""

from __future__ import annotations

import json
import sys
from enum import Enum
from pathlib import Path
from typing import Optional

import typer

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Validate, explain and launch RL post-training plans (PPO, GRPO; verl-compatible keys).")
presets_app = typer.Typer(no_args_is_help=False, add_completion=False, invoke_without_command=True,
                          help="List the bundled presets, or show one.")
app.add_typer(presets_app, name="presets")


class OutputFormat(str, Enum):
    text = "text"
    json = "json"


PLAN = typer.Argument(..., help="The plan YAML file.", show_default=False)
OVERRIDES = typer.Argument(None, help="Dotted overrides, e.g. actor_rollout_ref.rollout.n=8", show_default=False)
FORMAT = typer.Option(OutputFormat.text, "--format", "-f", help="text for people, json for machines.")


def _console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


@app.command()
def validate(plan: Path = PLAN, overrides: Optional[list[str]] = OVERRIDES, format: OutputFormat = FORMAT,
             strict: bool = typer.Option(False, "--strict", help="Fail (exit 1) on warnings too.")) -> None:
    """Check a plan: exit 0 valid (warnings allowed), 1 errors, 2 unreadable input."""
    from rlconf.compile import compile_plan

    result = compile_plan(plan, overrides or [], resolve=False)
    code = result.exit_code(strict)
    if format is OutputFormat.json:
        payload = {"plan": str(plan), "valid": code == 0, "exit_code": code,
                   "diagnostics": [d.to_json() for d in result.diagnostics]}
        print(json.dumps(payload, indent=2))
    else:
        from rlconf.render import print_diagnostics, summary_text

        console = _console()
        print_diagnostics(console, result.diagnostics, result.sources)
        console.print(summary_text(str(plan), result.diagnostics))
    raise typer.Exit(code)


@app.command()
def explain(plan: Path = PLAN, overrides: Optional[list[str]] = OVERRIDES, format: OutputFormat = FORMAT) -> None:
    """Show the resolved plan: world, placement, rollout replicas, per-GPU values with formulas, memory."""
    from rlconf.compile import compile_plan

    result = compile_plan(plan, overrides or [])
    code = result.exit_code()
    if format is OutputFormat.json and result.resolved is not None:
        print(result.resolved.model_dump_json(indent=2))
        raise typer.Exit(0)
    from rlconf.render import explain_renderable, print_diagnostics, summary_text

    console = _console()
    if result.resolved is not None and format is OutputFormat.text:
        console.print(explain_renderable(result.resolved))
        console.print()
    if format is OutputFormat.json:  # invalid plan: diagnostics as JSON, nothing resolved
        print(json.dumps({"plan": str(plan), "valid": False, "exit_code": code,
                          "diagnostics": [d.to_json() for d in result.diagnostics]}, indent=2))
        raise typer.Exit(code)
    print_diagnostics(console, result.diagnostics, result.sources)
    console.print(summary_text(str(plan), result.diagnostics))
    raise typer.Exit(code)


@app.command()
def launch(plan: Path = PLAN, overrides: Optional[list[str]] = OVERRIDES,
           run_dir: Optional[Path] = typer.Option(None, "--run-dir", help="Run directory; default trainer.default_local_dir."),
           address: Optional[str] = typer.Option(None, "--address", help="Join this Ray cluster instead of starting a local one."),
           dashboard: bool = typer.Option(False, "--dashboard", help="Start the Ray dashboard (local cluster only).")) -> None:
    """Compile the plan, write plan.resolved.json into the run directory and run it on Ray."""
    from rlconf.compile import compile_plan
    from rlconf.render import print_diagnostics, summary_text

    result = compile_plan(plan, overrides or [])
    console = _console(stderr=True)
    if result.resolved is None:
        print_diagnostics(console, result.diagnostics, result.sources)
        console.print(summary_text(str(plan), result.diagnostics))
        console.print("[bold red]not launching[/bold red]: fix the errors above first")
        raise typer.Exit(result.exit_code())
    print_diagnostics(console, result.warnings, result.sources)
    try:
        from engine.launch import run_launch
    except ImportError as exc:
        console.print(f"[bold red]error[/bold red]: the engine is not installed ({exc}); "
                      "install it with `pip install 'rlconf[engine]'` (and a torch build for your machine)")
        raise typer.Exit(2) from None
    raise typer.Exit(run_launch(result.resolved, run_dir=run_dir, address=address, dashboard=dashboard))


@presets_app.callback()
def presets_list(ctx: typer.Context) -> None:
    """List the bundled presets."""
    if ctx.invoked_subcommand is not None:
        return
    from rlconf.presets import list_presets

    console = _console()
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
        _console(stderr=True).print(f"[bold red]error[/bold red]: no preset `{name}`; bundled: {names}")
        raise typer.Exit(2)
    sys.stdout.write(preset.path.read_text())


def main() -> None:
    app()
