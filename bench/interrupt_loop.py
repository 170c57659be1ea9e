"""Run the Ctrl-C / SIGTERM tests many times under CPU load, to show they do not depend on timing.

    python bench/interrupt_loop.py [--iterations 20] [--load 2] [-k second_signal] [--log-dir DIR]

Starts `--load` busy-loop processes (default: one per core), then runs
`python -m pytest -q tests/engine/test_interrupt.py` (`-k` narrows it to some cases) once per
iteration, each in a fresh pytest process, and prints one line per iteration and a summary:
iterations that passed and failed, tests passed and failed, wall time. A failed iteration's output
goes to `--log-dir` (or its tail to stdout). Exit 1 if any iteration failed. Not part of CI: it
takes minutes per iteration. Results: docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TESTS = "tests/engine/test_interrupt.py"


def start_load(processes: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(processes)]


def stop_load(load: list[subprocess.Popen]) -> None:
    for proc in load:
        proc.kill()
    for proc in load:
        proc.wait()


def counts(output: str) -> dict[str, int]:
    """pytest's summary line (`3 passed, 1 failed in 80.1s`) as {"passed": 3, "failed": 1}."""
    found: dict[str, int] = {}
    for line in reversed(output.strip().splitlines()):
        pairs = re.findall(r"(\d+) (passed|failed|errors?|skipped|deselected)", line)
        if pairs:
            for number, what in pairs:
                found["error" if what.startswith("error") else what] = int(number)
            break
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=20)
    parser.add_argument("--load", type=int, default=os.cpu_count() or 1, help="busy-loop processes (default: cores)")
    parser.add_argument("-k", dest="select", default=None, help="pytest -k expression: run only these cases")
    parser.add_argument("--log-dir", type=Path, default=None, help="write a failed iteration's output here")
    args = parser.parse_args()

    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rfE", TESTS]
    if args.select:
        command += ["-k", args.select]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    print(f"{' '.join(command[1:])}: {args.iterations} iterations, {args.load} busy-loop processes on "
          f"{os.cpu_count()} cores", flush=True)
    results: list[tuple[int, dict[str, int], float]] = []
    started = time.perf_counter()
    load = start_load(args.load)
    try:
        for i in range(1, args.iterations + 1):
            begin = time.perf_counter()
            proc = subprocess.run(command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                  text=True)
            wall = time.perf_counter() - begin
            found = counts(proc.stdout)
            results.append((proc.returncode, found, wall))
            outcome = "ok" if proc.returncode == 0 else f"FAILED (exit {proc.returncode})"
            print(f"[{i:2d}/{args.iterations}] {outcome}  {found}  {wall:.0f} s  load {os.getloadavg()[0]:.1f}",
                  flush=True)
            if proc.returncode != 0:
                if args.log_dir is not None:
                    args.log_dir.mkdir(parents=True, exist_ok=True)
                    (args.log_dir / f"iteration_{i:02d}.log").write_text(proc.stdout)
                else:
                    print(proc.stdout[-4000:], flush=True)
    finally:
        stop_load(load)
    total = time.perf_counter() - started
    failed = sum(code != 0 for code, _, _ in results)
    tests_passed = sum(found.get("passed", 0) for _, found, _ in results)
    tests_failed = sum(found.get("failed", 0) + found.get("error", 0) for _, found, _ in results)
    walls = sorted(wall for _, _, wall in results)
    print(f"{len(results) - failed}/{len(results)} iterations passed, {failed} failed; tests: {tests_passed} passed, "
          f"{tests_failed} failed; wall {total:.0f} s (per iteration {walls[0]:.0f}-{walls[-1]:.0f} s)")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
