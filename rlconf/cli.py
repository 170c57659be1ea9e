"""`rlconf` entry point: `validate` and `explain` without typer when their arguments are plain.

Importing typer (with its vendored click) and building the pydantic TypeAdapters it makes for every
parameter was about a fifth of a cold `rlconf validate` (docs/benchmarks.md). `main()` therefore reads the command
line itself when it is one of the few plain forms below, and runs the same command bodies as the
typer app (rlconf/cli_app.py) does; everything else (help, completion, a typo, a value it does
not know, every other command) goes to the typer app, which prints typer's own help and errors.
So the fast path never has to imitate a message: it only takes what it is sure typer would parse
the same way, and `tests/compiler/test_cli_dispatch.py` runs both on the same arguments.

Plain forms:  rlconf validate PLAN [OVERRIDE...] [--format|-f text|json] [--format=text|json] [--strict]
              rlconf explain  PLAN [OVERRIDE...] [--format|-f text|json] [--format=text|json]
(options and positionals in any order, each option at most once, no token that starts with `-`
otherwise, no `--`).
"""

from __future__ import annotations

import gc
import os
import sys
from enum import Enum
from pathlib import Path
from typing import Any, NamedTuple


class OutputFormat(str, Enum):
    text = "text"
    json = "json"


def __getattr__(name: str) -> Any:
    """`from rlconf.cli import app` keeps working (tests and scripts), importing typer only then."""
    if name == "app":
        from rlconf.cli_app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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


class PlainCommand(NamedTuple):
    command: str  # validate or explain
    plan: Path
    overrides: list[str]
    format: OutputFormat
    strict: bool


FORMATS = {f.value: f for f in OutputFormat}  # typer's choice is case-sensitive: `JSON` goes to typer


def plain_command(argv: list[str]) -> PlainCommand | None:
    """The command when `argv` is one of the plain forms (module docstring), else None (typer's turn)."""
    if not argv or argv[0] not in ("validate", "explain"):
        return None
    command, positionals, seen = argv[0], [], set()
    format, strict = OutputFormat.text, False
    tokens = iter(argv[1:])
    for token in tokens:
        if not token.startswith("-"):
            positionals.append(token)
            continue
        option, value = token.split("=", 1) if token.startswith("--format=") else (token, None)
        if option in seen or (option == "-f" and "--format" in seen) or (option == "--format" and "-f" in seen):
            return None  # a repeated option: click takes the last, but leave such a line to it
        seen.add(option)
        if option in ("--format", "-f"):
            value = value if value is not None else next(tokens, None)
            if value not in FORMATS:
                return None  # missing or unknown: typer names the choices
            format = FORMATS[value]
        elif option == "--strict" and command == "validate":
            strict = True
        else:
            return None  # --help, --, -fjson, an unknown option, or a negative number as an override
    if not positionals:
        return None  # typer says PLAN is missing
    return PlainCommand(command, Path(positionals[0]), positionals[1:], format, strict)


def _typer_owns_the_run() -> bool:
    """Shell completion (typer reads `_RLCONF_COMPLETE` and the like) and Windows' wildcard expansion
    of arguments are typer's: leave those runs to it whatever the arguments."""
    return os.name == "nt" or any(name.endswith("_COMPLETE") for name in os.environ)


class _QuietOnClosedPipe:
    """A stream whose flush ignores a closed pipe (click's PacifyFlushWrapper, which typer uses)."""

    def __init__(self, wrapped) -> None:
        self.wrapped = wrapped

    def flush(self) -> None:
        try:
            self.wrapped.flush()
        except BrokenPipeError:
            pass

    def __getattr__(self, attr: str) -> Any:
        return getattr(self.wrapped, attr)


def main() -> None:
    from rlconf.plugin_loader import defer_plugin_loader

    defer_plugin_loader()  # `validate` and `explain` validate with plugins off: skip importing their loader
    plain = None if _typer_owns_the_run() else plain_command(sys.argv[1:])
    if plain is None:
        from rlconf.cli_app import app

        app()
        return
    # A run of a fraction of a second: Python's cyclic garbage collector would walk the growing heap of
    # pydantic's and rlconf's module objects again and again while they are imported (~15 ms), and
    # once more as the interpreter shuts down (~30 ms), to free about 0.3 MB. So it is off for the run,
    # and what exists at its end is frozen (gc.freeze: left out of all later collections) before the
    # collector is switched back on, for callers that go on (tests call main() in-process).
    collecting = gc.isenabled()
    gc.disable()
    try:
        if plain.command == "validate":
            code = run_validate(plain.plan, plain.overrides, plain.format, plain.strict)
        else:
            code = run_explain(plain.plan, plain.overrides, plain.format)
    except KeyboardInterrupt:
        code = 130  # as typer: Ctrl-C ends the command with 130, without a traceback
    except BrokenPipeError:
        # As typer (click): output cut short by a closed pipe (`| head`) ends with 1, and the flush at
        # exit must not raise again on the closed stream.
        sys.stdout, sys.stderr = _QuietOnClosedPipe(sys.stdout), _QuietOnClosedPipe(sys.stderr)
        code = 1
    finally:
        gc.freeze()
        if collecting:
            gc.enable()
    sys.exit(code)
