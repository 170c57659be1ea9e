"""`rlconf launch` in a process group of its own, its console streamed to a log file, watched until enough steps.

The benches run each launch on a lent GPU inside a call with a hard time limit. A launch that outlives
its share must not take the evidence with it: the console goes to `log_path` as it is printed, the
metrics written so far are read from metrics.jsonl, and the whole process group (Ray's and vLLM's
processes included) is killed at `timeout_s`. Once `steps` steps are in metrics.jsonl the launch is
sent SIGTERM (what follows — a final checkpoint if the plan saves one, the export, the shutdown's wait — is not measured),
and killed 60 s later if it has not exited.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path

STOP_GRACE_S = 60.0


@dataclass
class WatchedRun:
    exit: int | None
    wall_s: float
    timed_out: bool  # killed at the time limit
    stopped_after_last_step: bool  # SIGTERM once every step was measured
    records: list[dict] = field(default_factory=list)  # metrics.jsonl lines of steps >= 1
    traceback: str = ""  # the failing worker's traceback (run_dir/error.log), when the engine wrote one
    # Seconds from the start to when metrics.jsonl first held a step (within the 1 s between looks); None: not seen
    # while the launch ran.
    first_step_s: float | None = None


def kill_group(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def step_records(metrics_file: Path) -> list[dict]:
    """The training steps' lines of a metrics.jsonl (step >= 1), up to a line still being written."""
    if not metrics_file.is_file():
        return []
    records = []
    for line in metrics_file.read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            break
    return [r for r in records if r.get("step", 0) >= 1]


def steady_records(records: list[dict]) -> list[dict]:
    """The steps to time a steady step on: 2..N (step 1 pays for CUDA graphs, caches, Triton's kernel compiles
    and first allocations), or step 1 when it is all a run has."""
    return records[1:] or records


def watched_launch(command: list[str], run_dir: Path, steps: int, timeout_s: float, log_path: Path,
                   cwd: Path) -> WatchedRun:
    """Run `command` (an `rlconf launch ... --run-dir run_dir`), streaming its console to `log_path`."""
    started = time.perf_counter()
    stopped = timed_out = False
    first_step_s = None
    with open(log_path, "w") as log:
        log.write(" ".join(command[1:]) + "\n")
        log.flush()
        proc = subprocess.Popen(command, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, text=True,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"), start_new_session=True)
        stop_deadline = None
        try:
            while proc.poll() is None:
                time.sleep(1.0)
                if time.perf_counter() - started > timeout_s:
                    timed_out = True
                    kill_group(proc.pid)
                    break
                done = len(step_records(run_dir / "metrics.jsonl")) if stop_deadline is None else steps
                if first_step_s is None and done:
                    first_step_s = round(time.perf_counter() - started, 1)
                if stop_deadline is None and done >= steps:
                    stopped = True
                    proc.send_signal(signal.SIGTERM)
                    stop_deadline = time.perf_counter() + STOP_GRACE_S
                elif stop_deadline is not None and time.perf_counter() > stop_deadline:
                    kill_group(proc.pid)
                    break
        except BaseException:
            # Whatever stops the watching (a Ctrl-C, a bad metrics line), the launch must not outlive it: its
            # process group would keep the GPUs from the next run of the bench.
            kill_group(proc.pid)
            raise
        finally:
            proc.wait()
    error_log = run_dir / "error.log"
    return WatchedRun(proc.returncode, round(time.perf_counter() - started, 1), timed_out, stopped,
                      step_records(run_dir / "metrics.jsonl"),
                      error_log.read_text()[-4000:] if error_log.is_file() else "", first_step_s)
