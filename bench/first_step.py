"""Time to the first step: launches of one plan in fresh processes, cold then warm, phase by phase.

    python bench/first_step.py --cpu [--steps 2] [--runs 1]                  # the CPU quickstart (smoke check)
    python bench/first_step.py [--model random://Qwen2.5-0.5B] [--steps 4] [--runs 2] \
        [--variant eager=actor_rollout_ref.rollout.enforce_eager=true] \
        [--clear-caches] [--budget-s 540] [key=value ...]

Each run is `python -m rlconf launch presets/quickstart.yaml <overrides> --run-dir DIR` in a fresh
process. Without --cpu the overrides are bench/grpo_vs_trl.py's one-GPU workload (random-weight
Qwen2.5-0.5B shape, 8 prompts × 8 samples × 512 tokens, bf16, vLLM with CUDA graphs). `--runs`
launches of that plan come first, then each `--variant NAME=k=v,k=v` once with those overrides added,
so its trade shows against the plan's own run in the same call. A run is labelled `cold` when none of
the CACHES held anything before it (a fresh machine, or --clear-caches before the first run), else
`warm`; each run's cache sizes before it are in the JSON.

From each run: the console's `note:` lines about memory, every `start-up:` line, every line with
"warn" in it (any case) and every RL609 line, as printed; from metrics.jsonl the first step's
`timing/startup_*` keys (engine/startup.py: seconds per phase, `timing/startup_total` from the
command's start to the first step's metrics) and `timing/step` of every step. The first step's
excess over the median of the later steps is what step 1 alone pays (torch.compile of the layers with
`compile_layers`, first-use kernels such as the Triton loss head's). `plan` is the phase before Ray (compiling
the plan, the launch's checks), `imports` the driver's import of the engine once Ray is up (the workers import
theirs meanwhile); the actor_* columns are the actor workers' own pieces of `actor_load`; `other` = total −
phases − step 1: what falls between the timed phases.

Writes first_step.json and launch<N>.log (each run's console) under --out (else $OUT); prints a
table last. --budget-s: runs not started within that many seconds of the script's start are
skipped (and said so), so a device call ends inside its limit; --run-timeout-s kills a run's process
group after that many seconds (its metrics so far are still read).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))
from out_dir import out_dir  # noqa: E402

from watched_launch import kill_group  # noqa: E402

# What a launch caches on this machine for the next one (removed by --clear-caches).
CACHES = {
    "vllm": Path.home() / ".cache" / "vllm",  # vLLM's torch.compile artifacts
    "inductor": Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR")
                     or Path(tempfile.gettempdir()) / f"torchinductor_{os.environ.get('USER', 'root')}"),
    "triton": Path(os.environ.get("TRITON_CACHE_DIR") or Path.home() / ".triton"),
    "rlconf": Path(os.environ.get("RLCONF_CACHE_DIR") or Path.home() / ".cache" / "rlconf"),  # built model dirs
}
# The launch's phases in order (engine.startup: timing/startup_<phase>); the actor workers' own pieces of actor_load
# (timing/startup_actor_<piece>) are parts of it, not phases, and go in the table after it.
PHASES = ["plan", "ray", "imports", "model_files", "data", "actor_load", "rollout_engine", "rollout_load", "critic_load",
          "reward_model_load", "checkpoint_load"]
ACTOR_PIECES = ["actor_worker_start", "actor_process_group", "actor_model_load", "actor_build"]
KEEP = re.compile(r"^(start-up:|note: memory checks|step \d+/)|warn|RL609", re.IGNORECASE)


def workload(cpu: bool, model: str, steps: int) -> list[str]:
    if cpu:
        return [f"trainer.total_training_steps={steps}", "trainer.save_freq=-1"]
    from grpo_vs_trl import plan_overrides

    return plan_overrides(model, steps)


def cache_sizes() -> dict[str, int]:
    def size(path: Path) -> int:
        if not path.exists():
            return 0
        return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())

    return {name: size(path) for name, path in CACHES.items()}


def clear_caches() -> None:
    for path in CACHES.values():
        if path.is_dir():
            shutil.rmtree(path, ignore_errors=True)


def launch(index: int, label: str, overrides: list[str], out: Path, timeout: float) -> dict:
    """One launch in a fresh process group; its console goes to out/launch<index>.log."""
    log_path = out / f"launch{index}.log"
    kept: list[str] = []
    with tempfile.TemporaryDirectory(prefix="first_step_") as tmp:
        run_dir = Path(tmp) / "run"
        command = [sys.executable, "-m", "rlconf", "launch", str(ROOT / "presets" / "quickstart.yaml"), *overrides,
                   "--run-dir", str(run_dir)]
        print(f"--- run {index} ({label}): {' '.join(command[1:])}", flush=True)
        started = time.perf_counter()
        with open(log_path, "w") as log:
            proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                    env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
            watchdog = threading.Timer(timeout, kill_group, (proc.pid,))  # the launch and the Ray / vLLM it started
            watchdog.start()
            try:
                for line in proc.stdout:
                    log.write(line)
                    line = line.rstrip("\n")
                    if KEEP.search(line):
                        kept.append(line)
                        print(f"  {line}", flush=True)
                proc.wait()
            finally:
                timed_out = not watchdog.is_alive() and proc.returncode is not None and proc.returncode < 0
                watchdog.cancel()
        wall = time.perf_counter() - started
        metrics_file = run_dir / "metrics.jsonl"
        records = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.is_file() else []
    result = {"index": index, "label": label, "overrides": overrides, "exit": proc.returncode, "timed_out": timed_out,
              "wall_s": wall, "log": log_path.name,
              "memory_notes": [line for line in kept if line.startswith("note: memory checks")],
              "startup_lines": [line for line in kept if line.startswith("start-up:")],
              "warning_lines": [line for line in kept if "warn" in line.lower()],
              "rl609_lines": [line for line in kept if "RL609" in line],
              "step_s": [r["timing/step"] for r in records if "timing/step" in r]}
    if records:
        first = records[0]
        result["startup"] = {k[len("timing/startup_"):]: v for k, v in first.items() if k.startswith("timing/startup_")}
        later = result["step_s"][1:]
        result["steady_step_s"] = statistics.median(later) if later else None
        result["first_step_excess_s"] = result["step_s"][0] - result["steady_step_s"] if later else None
        phases = sum(v for k, v in result["startup"].items() if k in PHASES)
        result["startup"]["other"] = result["startup"].get("total", 0.0) - phases - result["step_s"][0]
        # Each stage of step 1 against the median of the later steps: where step 1's extra seconds go.
        stages = sorted({k for r in records for k in r
                         if k.startswith("timing/") and not k.startswith("timing/startup")})
        result["stages"] = {k: {"step1": first.get(k),
                                "later_median": statistics.median([r[k] for r in records[1:] if k in r])
                                if any(k in r for r in records[1:]) else None} for k in stages}
    return result


def fmt(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def table(results: list[dict]) -> str:
    seen = [p for p in [*PHASES, *ACTOR_PIECES] if any(p in r.get("startup", {}) for r in results)]
    head = ["run", "exit", "wall", "total", *seen, "step1", "other", "steady", "step1-steady"]
    rows = [head]
    for r in results:
        s = r.get("startup", {})
        step1 = r["step_s"][0] if r["step_s"] else None
        rows.append([f"{r['index']} {r['label']}", str(r["exit"]), fmt(r["wall_s"]), fmt(s.get("total")),
                     *[fmt(s.get(p)) for p in seen], fmt(step1), fmt(s.get("other")), fmt(r.get("steady_step_s")),
                     fmt(r.get("first_step_excess_s"))])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(cell.rjust(w) if i else cell.ljust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpu", action="store_true", help="the CPU quickstart as it is (a smoke check)")
    parser.add_argument("--model", default="random://Qwen2.5-0.5B")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--runs", type=int, default=2, help="launches of the plan itself: the first cold, then warm")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=k=v,k=v",
                        help="one more warm launch with these overrides added (repeatable)")
    parser.add_argument("--clear-caches", action="store_true", help="remove the CACHES before the first run")
    parser.add_argument("--budget-s", type=float, default=None, help="start no run after this many seconds")
    parser.add_argument("--run-timeout-s", type=float, default=900, help="kill a run after this many seconds")
    parser.add_argument("--out", default=None, help="where files go (default: $OUT, else a temp dir)")
    parser.add_argument("overrides", nargs="*", help="key=value overrides added to every run")
    args = parser.parse_args()
    began = time.perf_counter()
    out = out_dir(args.out, "first_step_out_")
    out.mkdir(parents=True, exist_ok=True)
    base = workload(args.cpu, args.model, args.steps) + args.overrides
    plans = [("", base) for _ in range(args.runs)]  # labelled cold / warm by the caches just before each
    for spec in args.variant:
        name, _, extra = spec.partition("=")
        plans.append((name, base + [kv for kv in extra.split(",") if kv]))
    if args.clear_caches:
        clear_caches()
    report: dict = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "runs": [], "skipped": []}
    if shutil.which("nvidia-smi"):  # not torch.cuda: this process must not hold a CUDA context on the GPU
        report["device"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                           "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    for index, (label, overrides) in enumerate(plans, start=1):
        elapsed = time.perf_counter() - began
        if args.budget_s is not None and elapsed > args.budget_s:
            report["skipped"].append(label or "plan")
            print(f"--- run {index} ({label or 'plan'}) skipped: {elapsed:.0f}s of the {args.budget_s:.0f}s "
                  "budget spent", flush=True)
            continue
        caches = cache_sizes()
        label = label or ("warm" if any(caches.values()) else "cold")
        result = launch(index, label, overrides, out, args.run_timeout_s)
        result["cache_bytes_before"] = caches
        report["runs"].append(result)
        (out / "first_step.json").write_text(json.dumps(report, indent=2) + "\n")  # after each run: a kill keeps it
    print(f"\nwrote {out / 'first_step.json'}")
    print("seconds; total = the command's start to step 1's metrics; steady = median of steps 2..N")
    print(table(report["runs"]))
    if report["skipped"]:
        print(f"skipped (budget): {', '.join(report['skipped'])}")
    if any(r["exit"] != 0 for r in report["runs"]):
        sys.exit(1)


if __name__ == "__main__":
    main()
