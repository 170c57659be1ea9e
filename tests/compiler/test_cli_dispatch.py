"""The entry point (rlconf.cli.main) runs plain `validate` and `explain` lines without typer; every
line must come out exactly as the typer app alone prints it: same stdout, stderr and exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from rlconf.cli import PlainCommand, plain_command
from rlconf.commands import OutputFormat

REPO = Path(__file__).resolve().parents[2]
GOOD = "presets/grpo_7b_8gpu.yaml"
INVALID = "actor_rollout_ref.rollout.tensor_model_parallel_size=3"  # RL302: an error, exit 1
WARNED = "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=3"  # RL403: a warning only

# Runs each command line (JSON on stdin) in turn in one interpreter, with stdout and stderr
# captured (not terminals, as in a pipe), and prints [exit code, stdout, stderr] for each: one
# process per side keeps this test fast; the lines' fresh-process behaviour is test_light_imports'.
HARNESS = """
import contextlib, io, json, sys
from rlconf.plugin_loader import defer_plugin_loader

def entry_point():
    from rlconf.cli import main
    main()

def typer_only():  # the entry point as it was before the fast path: always the typer app
    from rlconf.cli_app import app
    app()

run = {"entry_point": entry_point, "typer_only": typer_only}[sys.argv[1]]
defer_plugin_loader()
results = []
for args in json.load(sys.stdin):
    sys.argv = ["rlconf", *args]  # the same program name for both, so typer's usage lines read alike
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            run()
            code = 0
        except SystemExit as exc:
            code = exc.code
    results.append([code, out.getvalue(), err.getvalue()])
json.dump(results, sys.__stdout__)
"""


# Lines the entry point reads itself (each is also checked to parse as plain below).
PLAIN_LINES = [
    ("validate", GOOD),
    ("validate", GOOD, "--format", "json"),
    ("validate", "--format=json", GOOD, WARNED),
    ("validate", GOOD, WARNED, "--strict"),
    ("validate", "-f", "text", GOOD, WARNED),
    ("validate", GOOD, INVALID),
    ("validate", GOOD, INVALID, "-f", "json"),
    ("validate", "presets/no_such_plan.yaml"),
    ("explain", GOOD),
    ("explain", GOOD, "--format", "json"),
    ("explain", GOOD, INVALID),
    ("explain", GOOD, INVALID, "--format=json"),
]
# Lines left to typer: help, usage errors, forms the entry point does not read, other commands.
TYPER_LINES = [
    (),
    ("--help",),
    ("validate", "--help"),
    ("explain", GOOD, "--help"),
    ("validate",),
    ("validate", GOOD, "--format", "yaml"),
    ("validate", GOOD, "--format"),
    ("validate", GOOD, "-fjson"),
    ("validate", GOOD, "--format", "json", "-f", "text"),
    ("validate", GOOD, "--", "-1"),
    ("explain", GOOD, "--strict"),
    ("valdate", GOOD),
    ("presets",),
]


def run_all(side: str, lines: list[tuple[str, ...]], env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run([sys.executable, "-c", HARNESS, side], cwd=REPO, capture_output=True, text=True,
                          input=json.dumps(lines), timeout=300, env={**os.environ, **(env or {})})
    assert proc.returncode == 0, proc.stderr
    return dict(zip(lines, map(tuple, json.loads(proc.stdout))))


@pytest.fixture(scope="module")
def both_sides() -> tuple[dict, dict]:
    lines = PLAIN_LINES + TYPER_LINES
    return run_all("entry_point", lines), run_all("typer_only", lines)


@pytest.mark.parametrize("args", PLAIN_LINES + TYPER_LINES, ids=lambda a: " ".join(a) or "(no arguments)")
def test_entry_point_prints_what_the_typer_app_prints(args: tuple[str, ...], both_sides: tuple[dict, dict]):
    entry_point, typer_only = both_sides
    assert entry_point[args] == typer_only[args]
    assert entry_point[args][0] in (0, 1, 2)


def test_styled_output_is_the_same_too():
    """With FORCE_COLOR rich styles the report (as on a terminal): both paths print it through rich."""
    lines = [("validate", GOOD, INVALID), ("validate", GOOD, WARNED)]
    entry_point = run_all("entry_point", lines, env={"FORCE_COLOR": "1"})
    assert entry_point == run_all("typer_only", lines, env={"FORCE_COLOR": "1"})
    assert all("\x1b[" in stdout for _, stdout, _ in entry_point.values())


@pytest.mark.parametrize("args", PLAIN_LINES, ids=" ".join)
def test_plain_lines_are_read_by_the_entry_point(args: tuple[str, ...]):
    assert plain_command(list(args)) is not None


@pytest.mark.parametrize("args", TYPER_LINES, ids=lambda a: " ".join(a) or "(no arguments)")
def test_other_lines_are_left_to_typer(args: tuple[str, ...]):
    assert plain_command(list(args)) is None


def test_plain_command_reads_options_anywhere_on_the_line():
    assert plain_command(["validate", "--strict", "plan.yaml", "a.b=1", "-f", "json", "c=2"]) == PlainCommand(
        "validate", Path("plan.yaml"), ["a.b=1", "c=2"], OutputFormat.json, True)
    assert plain_command(["explain", "plan.yaml"]) == PlainCommand(
        "explain", Path("plan.yaml"), [], OutputFormat.text, False)


def test_shell_completion_is_left_to_typer(monkeypatch: pytest.MonkeyPatch):
    from rlconf.cli import _typer_owns_the_run

    monkeypatch.setenv("_RLCONF_COMPLETE", "bash_source")
    assert _typer_owns_the_run()


def test_a_closed_pipe_ends_both_alike():
    """`rlconf explain ... | head -0`: the reader is gone before the output is written. typer (click)
    ends such a run with exit 1 and nothing on stderr; so does the entry point's own path."""
    for program in ("from rlconf.cli import main; main()", "from rlconf.cli_app import app; app()"):
        proc = subprocess.Popen([sys.executable, "-c", program, "explain", GOOD, "--format", "json"], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        proc.stdout.close()  # long before the interpreter has started, let alone compiled the plan
        assert proc.wait(timeout=120) == 1
        assert proc.stderr.read() == b""
        proc.stderr.close()


def test_the_garbage_collector_is_back_on_after_a_run():
    """The entry point's own path runs with the cyclic garbage collector off (it only walks the
    imported modules' objects in a run this short) and switches it back on for callers that go on."""
    probe = ("import gc, sys\nsys.argv = ['rlconf', 'validate', %r]\nfrom rlconf.cli import main\n"
             "try:\n    main()\nexcept SystemExit as exc:\n    print(exc.code, gc.isenabled(), gc.get_freeze_count() > 0)" % GOOD)
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.stdout.split()[-3:] == ["0", "True", "True"], proc.stderr
