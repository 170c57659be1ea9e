"""The bodies of `rlconf validate` and `explain`: compile, then print, returning the exit code.

Shared by the fast entry point (rlconf.cli, no typer) and the typer app (rlconf.cli_app), so both
print the same thing; this module imports neither of them, nor anything heavy at import time.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path


class OutputFormat(str, Enum):
    text = "text"
    json = "json"


def make_console(stderr: bool = False):
    from rich.console import Console

    return Console(stderr=stderr, highlight=False, soft_wrap=True)


def _rich_styles(stream) -> bool:
    """Whether rich would style output to `stream` (rich.console.Console.is_terminal, read the same
    way). When it would not, its output is plain text that rlconf can write without importing rich."""
    import builtins

    if hasattr(builtins, "get_ipython"):
        return True  # IPython or Jupyter: leave the decision to rich
    tty_compatible = os.environ.get("TTY_COMPATIBLE", "")
    if tty_compatible in ("0", "1"):
        return tty_compatible == "1"
    force_color = os.environ.get("FORCE_COLOR")
    if force_color is not None:
        return force_color != ""
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # no isatty, or a closed stream
        return False


def run_validate(plan: Path, overrides: list[str], format: OutputFormat, strict: bool) -> int:
    """`rlconf validate`: print the diagnostics and return the exit code."""
    from rlconf.compile import compile_plan

    result = compile_plan(plan, overrides, resolve=False)
    code = result.exit_code(strict)
    if format is OutputFormat.json:
        import json  # only for --format json: plain text is the common case

        payload = {"plan": str(plan), "valid": code == 0, "exit_code": code,
                   "diagnostics": [d.to_json() for d in result.diagnostics]}
        print(json.dumps(payload, indent=2))
    else:
        from rlconf.render import plain_report

        report = None if _rich_styles(sys.stdout) else plain_report(str(plan), result.diagnostics, result.sources)
        if report is not None:
            sys.stdout.write(report)  # the same text rich would print here, without importing rich
        else:
            from rlconf.render import print_diagnostics, summary_text

            console = make_console()
            print_diagnostics(console, result.diagnostics, result.sources)
            console.print(summary_text(str(plan), result.diagnostics))
    return code


def run_explain(plan: Path, overrides: list[str], format: OutputFormat) -> int:
    """`rlconf explain`: print the resolved plan (or the diagnostics) and return the exit code."""
    from rlconf.compile import compile_plan

    result = compile_plan(plan, overrides)
    code = result.exit_code()
    if format is OutputFormat.json and result.resolved is not None:
        print(result.resolved.model_dump_json(indent=2))
        return 0
    from rlconf.render import explain_renderable, print_diagnostics, summary_text

    console = make_console()
    if result.resolved is not None and format is OutputFormat.text:
        console.print(explain_renderable(result.resolved))
        console.print()
    if format is OutputFormat.json:  # invalid plan: diagnostics as JSON, nothing resolved
        import json

        print(json.dumps({"plan": str(plan), "valid": False, "exit_code": code,
                          "diagnostics": [d.to_json() for d in result.diagnostics]}, indent=2))
        return code
    print_diagnostics(console, result.diagnostics, result.sources)
    console.print(summary_text(str(plan), result.diagnostics))
    return code
