"""Cold wall time of `rlconf validate` on a preset: a new interpreter per run, as a user types it.

    python bench/validate_cold.py [--runs 20] [--preset grpo_7b_8gpu]
    python bench/validate_cold.py --baseline /tmp/old   # another checkout, e.g. `git archive main | tar -x -C /tmp/old`

Prints the median and min wall time of the console command next to a bare `python -c pass`
and `import rlconf.cli` baseline, measured side by side in the same run. Target: median
under 0.3 s on the 2-core CI machine (docs/benchmarks.md). With --baseline, `rlconf validate`
runs alternately from this tree and the other one (PYTHONPATH), so load on a shared machine
hits both alike.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


# "Cold" means a fresh process, not a fresh disk: like a user's Python, the children cache bytecode.
# Some sandboxes export PYTHONDONTWRITEBYTECODE=1, which would recompile rlconf's modules every run.
CHILD_ENV = {key: value for key, value in os.environ.items() if key != "PYTHONDONTWRITEBYTECODE"}


def wall(cmd: list[str], runs: int, tree: Path = ROOT) -> list[float]:
    times = []
    env = {**CHILD_ENV, "PYTHONPATH": str(tree)} if tree != ROOT else CHILD_ENV
    for _ in range(runs):
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        times.append(time.perf_counter() - start)
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--preset", default="grpo_7b_8gpu")
    parser.add_argument("--baseline", type=Path, help="another checkout to compare `rlconf validate` with, run alternately")
    args = parser.parse_args()
    plan = f"presets/{args.preset}.yaml"
    rlconf = shutil.which("rlconf") or sys.exit("rlconf is not on PATH: pip install -e .")
    wall([rlconf, "validate", plan], 2)  # write .pyc files first
    cases = {
        "python -c pass": [sys.executable, "-c", "pass"],
        # The floor set by the libraries the CLI is built on (imported, nothing run).
        "import pydantic, typer, rich, ruamel.yaml": [sys.executable, "-c",
                                                      "import pydantic.main, typer, rich.console, ruamel.yaml"],
        "python -c 'import rlconf.cli'": [sys.executable, "-c", "import rlconf.cli"],
        f"rlconf validate {plan}": [rlconf, "validate", plan],
        f"rlconf explain {plan}": [rlconf, "explain", plan],
    }
    print(f"# {platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · {args.runs} runs each"
          + (" · PYTHONDONTWRITEBYTECODE unset for the runs" if "PYTHONDONTWRITEBYTECODE" in os.environ else ""))
    print(f"{'command':<48} {'median s':>9} {'min s':>7}")
    if args.baseline:
        compare(rlconf, plan, args.baseline.resolve(), args.runs)
        return
    for label, cmd in cases.items():
        times = wall(cmd, args.runs)
        print(f"{label:<48} {statistics.median(times):>9.3f} {min(times):>7.3f}")


def compare(rlconf: str, plan: str, baseline: Path, runs: int) -> None:
    cmd = [rlconf, "validate", plan]
    wall(cmd, 1, baseline)  # bytecode for the other tree too
    times: dict[str, list[float]] = {str(baseline): [], "this tree": []}
    for _ in range(runs):
        times[str(baseline)] += wall(cmd, 1, baseline)
        times["this tree"] += wall(cmd, 1)
    for label, values in times.items():
        print(f"{'rlconf validate ' + plan + ' (' + label + ')':<48} {statistics.median(values):>9.3f} {min(values):>7.3f}")


if __name__ == "__main__":
    main()
