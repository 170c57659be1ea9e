"""`rlconf` entry point: `validate` and `explain` without typer when their arguments are plain.

Importing typer (with its vendored click) and building the pydantic TypeAdapters it makes for every
parameter was about a fifth of a cold `rlconf validate` (docs/benchmarks.md). `main()` therefore reads the command
line itself when it is one of the few plain forms below, and runs the same command bodies as the
typer app (rlconf/cli_app.py) does (both call rlconf/commands.py); everything else (help, completion, a typo, a value it does
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
from pathlib import Path
from typing import Any, NamedTuple

from rlconf.commands import OutputFormat, run_explain, run_validate


def __getattr__(name: str) -> Any:
    """`from rlconf.cli import app` keeps working (tests and scripts), importing typer only then."""
    if name == "app":
        from rlconf.cli_app import app

        return app
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


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
