"""Cold wall time of `rlconf validate` on a preset: a new interpreter per run, as a user types it.

    python bench/validate_cold.py [--runs 20] [--preset grpo_7b_8gpu]
    python bench/validate_cold.py --baseline /tmp/old   # another checkout, e.g. `git archive main | tar -x -C /tmp/old`

Prints the median and min wall time (and the median CPU time, user + system, which a loaded
machine disturbs less) of the console command next to a bare `python -c pass`,
the import of the libraries the CLI is built on (pydantic, typer, rich, ruamel.yaml) and the
libraries `validate` runs on doing the least it does (ruamel.yaml imported, one pydantic model
validated; `validate` runs without typer, and without rich when the output is no terminal), measured
side by side in the same run: the cases take turns, round after round, so that a slower stretch
of a shared machine falls on all of them alike. Then the ratio of `rlconf validate` to the
libraries' import, by wall and by CPU time, and to that import with the garbage collector set as
`validate` runs it (off, and the heap frozen at the end). Targets on the 2-core CI machine
(docs/benchmarks.md): median at most 0.25 s, and at most 1.3 x the libraries' import. With --baseline, `rlconf validate` from the
other tree (PYTHONPATH) takes its turn in each round too, and the two trees' ratio is printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
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
LIBRARIES = "import pydantic, typer, rich, ruamel.yaml"
# validate runs with the cyclic garbage collector off and freezes the heap before it exits
# (rlconf/cli.py); the same import with the same settings is the like-for-like floor.
LIBRARIES_NO_GC = "the same, collector off and frozen as validate runs"
USED = "ruamel.yaml + one pydantic model validated"


def cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def wall(cmd: list[str], tree: Path = ROOT) -> tuple[float, float]:
    """(wall seconds, CPU seconds) of one run. The CPU time (user + system of the child) moves far
    less than the wall time when other work shares the cores, so ratios are given in both."""
    env = {**CHILD_ENV, "PYTHONPATH": str(tree)} if tree != ROOT else CHILD_ENV
    cpu_before, start = cpu_of_children(), time.perf_counter()
    proc = subprocess.run(cmd, cwd=tree, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    elapsed, cpu = time.perf_counter() - start, cpu_of_children() - cpu_before
    if proc.returncode != 0:
        sys.exit(f"{' '.join(cmd)} exited {proc.returncode}: {proc.stderr.decode()[-500:]}")
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--preset", default="grpo_7b_8gpu")
    parser.add_argument("--baseline", type=Path, help="another checkout whose `rlconf validate` runs in the same rounds")
    args = parser.parse_args()
    plan = f"presets/{args.preset}.yaml"
    rlconf = shutil.which("rlconf") or sys.exit("rlconf is not on PATH: pip install -e .")
    validate = f"rlconf validate {plan}"
    cases: dict[str, list[str]] = {
        "python -c pass": [sys.executable, "-c", "pass"],
        # The floor set by the libraries the CLI is built on (imported, nothing run).
        LIBRARIES: [sys.executable, "-c", "import pydantic.main, typer, rich.console, ruamel.yaml"],
        LIBRARIES_NO_GC: [sys.executable, "-c", "import gc\ngc.disable()\n"
                                                "import pydantic.main, typer, rich.console, ruamel.yaml\ngc.freeze()"],
        # What `validate` pays its libraries before its own code: `import pydantic.main` leaves out
        # pydantic.fields (with pydantic.types, annotated_types and secrets behind it), which any model
        # with fields needs; the validator is built with plugins off and rlconf's stand-in loader, as `validate` does.
        USED: [sys.executable, "-c", "import os\nos.environ['PYDANTIC_DISABLE_PLUGINS'] = '1'\n"
                                     "from rlconf.plugin_loader import defer_plugin_loader\ndefer_plugin_loader()\n"
                                     "import ruamel.yaml\nfrom pydantic import BaseModel, Field\n"
                                     "class Plan(BaseModel):\n    n: int = Field(default=1, gt=0)\nPlan(n=2)"],
        # The compiler's modules (the schema's model classes built, nothing validated), pydantic included.
        "python -c 'import rlconf.compile'": [sys.executable, "-c", "import rlconf.compile"],
        validate: [rlconf, "validate", plan],
        f"rlconf explain {plan}": [rlconf, "explain", plan],
    }
    trees = {label: ROOT for label in cases}
    if args.baseline:
        label = f"{validate} ({args.baseline})"
        cases[label], trees[label] = [rlconf, "validate", plan], args.baseline.resolve()
    for label, cmd in cases.items():  # write .pyc files first
        wall(cmd, trees[label])
    times: dict[str, list[float]] = {label: [] for label in cases}
    cpu: dict[str, list[float]] = {label: [] for label in cases}
    for _ in range(args.runs):
        for label, cmd in cases.items():
            elapsed, used = wall(cmd, trees[label])
            times[label].append(elapsed)
            cpu[label].append(used)
    print(f"# {platform.node()} · {os.cpu_count()} CPUs · Python {platform.python_version()} · {args.runs} runs each"
          + (" · PYTHONDONTWRITEBYTECODE unset for the runs" if "PYTHONDONTWRITEBYTECODE" in os.environ else ""))
    print(f"{'command':<48} {'median s':>9} {'min s':>7} {'CPU median s':>13}")
    for label, samples in times.items():
        print(f"{label:<48} {statistics.median(samples):>9.3f} {min(samples):>7.3f} {statistics.median(cpu[label]):>13.3f}")
    for baseline in (LIBRARIES, LIBRARIES_NO_GC):
        for kind, measured in (("wall", times), ("CPU", cpu)):
            ratio = statistics.median(measured[validate]) / statistics.median(measured[baseline])
            print(f"{validate} ÷ {baseline}: {ratio:.2f}× ({kind} medians)")
    if args.baseline:
        for kind, measured in (("wall", times), ("CPU", cpu)):
            ratio = statistics.median(measured[validate]) / statistics.median(measured[label])
            print(f"{validate}: this tree ÷ {args.baseline}: {ratio:.2f}× ({kind} medians)")


if __name__ == "__main__":
    main()
