"""`rlconf validate` and `rlconf explain` must stay light: no torch, ray, transformers, vllm, matplotlib or loggers.

Each check runs the real CLI (`python -m rlconf ...`) in a fresh interpreter, through a wrapper that
(1) records every attempt to import a heavy package (a sys.meta_path finder, so an attempt is caught
even where the package is not installed or the import is wrapped in try/except) and (2) dumps
`sorted(sys.modules)` at exit (atexit, so it runs after the CLI's SystemExit).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
# matplotlib (rlconf report) and the logger packages ride along with the engine commands only.
HEAVY = ("torch", "ray", "transformers", "vllm", "matplotlib", "tensorboard", "wandb")

WRAPPER = textwrap.dedent("""
    import atexit, json, runpy, sys

    report_path, preimport, argv = sys.argv[1], sys.argv[2], sys.argv[3:]
    HEAVY = {heavy!r}
    attempted = []

    class Recorder:
        # Sees every top-level import before the normal finders; records heavy ones, finds nothing.
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in HEAVY:
                attempted.append(name)
            return None

    sys.meta_path.insert(0, Recorder())

    def dump():
        with open(report_path, "w") as f:
            json.dump({{"modules": sorted(sys.modules), "attempted": attempted}}, f)

    atexit.register(dump)
    if preimport:
        __import__(preimport)  # only the detection self-test uses this
    sys.argv = ["rlconf", *argv]
    runpy.run_module("rlconf", run_name="__main__", alter_sys=True)
""").format(heavy=HEAVY)


def run_cli(tmp_path: Path, *args: str, preimport: str = "", extra_path: Path | None = None) -> tuple[int, dict]:
    report = tmp_path / "modules.json"
    env = dict(os.environ)
    if extra_path is not None:  # put a stand-in package ahead of everything else
        env["PYTHONPATH"] = os.pathsep.join([str(extra_path)] + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else []))
    proc = subprocess.run([sys.executable, "-c", WRAPPER, str(report), preimport, *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)
    assert report.exists(), f"the wrapper wrote no report:\n{proc.stdout}\n{proc.stderr}"
    return proc.returncode, json.loads(report.read_text())


def heavy_modules(report: dict) -> list[str]:
    loaded = [m for m in report["modules"] if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    return sorted(set(loaded) | set(report["attempted"]))


COMMANDS = [
    ("validate", "presets/grpo_7b_8gpu.yaml"),
    ("validate", "presets/ppo_critic_split.yaml", "--format", "json"),
    ("explain", "presets/grpo_7b_8gpu.yaml"),
    ("explain", "presets/ppo_critic_split.yaml", "--format", "json"),
    # an invalid plan takes the diagnostics-rendering path
    ("validate", "presets/grpo_7b_8gpu.yaml", "actor_rollout_ref.rollout.tensor_model_parallel_size=3"),
]


# `rlconf tune` compiles dozens of candidate plans: it must stay as light as validate (typer is fine).
TUNE_COMMANDS = [("tune", "presets/grpo_7b_8gpu.yaml"), ("tune", "presets/ppo_critic_split.yaml", "--format", "json")]


@pytest.mark.parametrize("args", COMMANDS + TUNE_COMMANDS, ids=lambda a: " ".join(a))
def test_cli_paths_import_no_heavy_packages(args: tuple[str, ...], tmp_path: Path):
    code, report = run_cli(tmp_path, *args)
    invalid = any("=" in a for a in args)
    assert code == (1 if invalid else 0)
    # The detection sees the modules the CLI really used (so an empty heavy list means something).
    for used in ("pydantic", "rlconf.compile", "rlconf.normalize", "rlconf.cli"):
        assert used in report["modules"], used
    assert heavy_modules(report) == []


@pytest.mark.parametrize("args", COMMANDS, ids=lambda a: " ".join(a))
def test_plain_validate_and_explain_run_without_typer(args: tuple[str, ...], tmp_path: Path):
    """rlconf.cli.main runs plain `validate`/`explain` lines itself: typer, its vendored click and
    the pydantic TypeAdapters it builds for parameters (a quarter of a cold `validate`) stay out."""
    code, report = run_cli(tmp_path, *args)
    assert code in (0, 1)
    assert "rlconf.compile" in report["modules"]
    assert not [m for m in report["modules"] if m == "typer" or m.startswith(("typer.", "click", "rlconf.cli_app"))]


def test_help_goes_to_typer(tmp_path: Path):
    """The contrast that makes the test above mean something: what the entry point does not read
    itself (here --help) is typer's, and then typer is imported."""
    code, report = run_cli(tmp_path, "validate", "--help")
    assert code == 0
    assert {"typer", "rlconf.cli_app"} <= set(report["modules"])


def test_validate_skips_pydantic_plugin_loader(tmp_path: Path):
    """`validate` builds its validators with plugins off, so rlconf.plugin_loader keeps pydantic's
    loader and the importlib.metadata behind it (17 ms of a cold start) out of the process."""
    code, report = run_cli(tmp_path, "validate", "presets/grpo_7b_8gpu.yaml")
    assert code == 0
    assert "pydantic.main" in report["modules"]  # validators were built
    assert "importlib.metadata" not in report["modules"]


def test_validate_of_a_valid_plan_skips_json_and_difflib(tmp_path: Path):
    """json (for --format json, local model configs and verl's key list) and difflib (did-you-mean
    help) are imported where they are used: a valid plan of rlconf's keys, printed as text, needs
    neither (3 ms of a cold `rlconf validate`)."""
    # Not through run_cli: its wrapper imports json to write its report.
    probe = ("import atexit, sys\n"
             "atexit.register(lambda: print('json' in sys.modules, 'difflib' in sys.modules, file=sys.stderr))\n"
             "sys.argv = ['rlconf', 'validate', 'presets/grpo_7b_8gpu.yaml']\n"
             "from rlconf.cli import main\nmain()")
    proc = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr.split() == ["False", "False"]


def test_detection_catches_a_heavy_import(tmp_path: Path):
    """Self-test: the same wrapper flags a heavy package once something imports it. A stand-in `torch`
    (an empty package earlier on the path) keeps this test fast and independent of what is installed."""
    fake = tmp_path / "fake_site"
    (fake / "torch").mkdir(parents=True)
    (fake / "torch" / "__init__.py").write_text("")
    (fake / "torch" / "cuda.py").write_text("")
    code, report = run_cli(tmp_path, "validate", "presets/quickstart.yaml", preimport="torch.cuda", extra_path=fake)
    assert code == 0
    assert heavy_modules(report) == ["torch", "torch.cuda"]


def test_detection_catches_an_attempted_import_of_a_missing_package(tmp_path: Path):
    """Self-test: an import attempt is recorded even when it fails (as behind `try: import vllm`)."""
    report_path = tmp_path / "modules.json"
    subprocess.run([sys.executable, "-c", WRAPPER, str(report_path), "vllm.engine", "validate", "presets/quickstart.yaml"],
                   cwd=REPO, capture_output=True, text=True, timeout=120)
    # vllm absent: ModuleNotFoundError ends the run, atexit still writes the report; present: it is loaded.
    report = json.loads(report_path.read_text())
    assert "vllm" in heavy_modules(report)
