"""Wall time and per-stage time of `rlconf launch presets/quickstart.yaml` on this machine.

    python bench/quickstart_launch.py [--plan presets/quickstart.yaml] [key=value ...]

Runs the console command in a fresh process, as a user types it (model and data building and Ray
start-up included), into a temporary run directory, then reads its metrics.jsonl: median seconds
per stage per step, tokens/s, and the mean reward of the first and last 5 steps.
The issue's bar: the quickstart finishes in under 10 minutes on the 2-core CI machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--plan", default="presets/quickstart.yaml")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    rlconf = shutil.which("rlconf") or sys.exit("rlconf is not on PATH: pip install -e '.[engine]'")
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        env = dict(os.environ, RLCONF_CACHE_DIR=str(Path(tmp) / "cache"))  # cold: build the tiny model and data
        cmd = [rlconf, "launch", args.plan, "--run-dir", str(run_dir), *args.overrides]
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        wall = time.perf_counter() - start
        if proc.returncode != 0:
            sys.exit(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stderr[-2000:]}")
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    print(f"command: rlconf launch {args.plan} {' '.join(args.overrides)}".rstrip())
    print(f"wall (process start to exit): {wall:.1f} s for {len(metrics)} steps")
    stages = sorted(k for k in metrics[0] if k.startswith("timing/"))
    print("median seconds per step:")
    for key in stages:
        print(f"  {key:<36} {statistics.median(m[key] for m in metrics):8.3f}")
    print(f"  {'perf/tokens_per_second':<36} {statistics.median(m['perf/tokens_per_second'] for m in metrics):8.0f}")
    k = min(5, len(metrics))
    first = sum(m["reward/mean"] for m in metrics[:k]) / k
    last = sum(m["reward/mean"] for m in metrics[-k:]) / k
    print(f"reward mean: first {k} steps {first:.3f}, last {k} steps {last:.3f} ({last / first if first else float('inf'):.1f}x)")


if __name__ == "__main__":
    main()
