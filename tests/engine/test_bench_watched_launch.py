"""bench/watched_launch.py: a launch stopped once its steps are measured, or killed at its time limit with its
console and finished steps kept (what the GPU benches rely on inside a call's hard limit)."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from watched_launch import steady_records, watched_launch  # noqa: E402

# Stands in for `rlconf launch`: writes one metrics line a step, then waits forever (or ignores SIGTERM).
FAKE_LAUNCH = """
import json, signal, sys, time
run_dir, steps, ignore_term = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
if ignore_term:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
print("start-up: a fake launch", flush=True)
with open(run_dir + "/metrics.jsonl", "w") as out:
    for step in range(1, steps + 1):
        out.write(json.dumps({"step": step, "timing/step": 0.1}) + "\\n")
        out.flush()
        time.sleep(0.1)
time.sleep(600)
"""


def _fake(tmp_path: Path, steps: int, ignore_term: bool) -> tuple[list[str], Path]:
    script = tmp_path / "fake_launch.py"
    script.write_text(FAKE_LAUNCH)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    return [sys.executable, str(script), str(run_dir), str(steps), "1" if ignore_term else "0"], run_dir


def test_a_launch_is_stopped_once_its_steps_are_measured_and_its_console_is_kept(tmp_path):
    command, run_dir = _fake(tmp_path, steps=3, ignore_term=False)
    run = watched_launch(command, run_dir, steps=3, timeout_s=60, log_path=tmp_path / "log.txt", cwd=tmp_path)
    assert run.stopped_after_last_step and not run.timed_out
    assert [r["step"] for r in run.records] == [1, 2, 3]
    assert run.wall_s < 30
    assert run.first_step_s is not None and 0 < run.first_step_s <= run.wall_s
    assert "start-up: a fake launch" in (tmp_path / "log.txt").read_text()


def test_a_launch_past_its_time_limit_is_killed_and_keeps_the_steps_it_finished(tmp_path):
    command, run_dir = _fake(tmp_path, steps=2, ignore_term=True)
    run = watched_launch(command, run_dir, steps=5, timeout_s=3, log_path=tmp_path / "log.txt", cwd=tmp_path)
    assert run.timed_out and not run.stopped_after_last_step
    assert [r["step"] for r in run.records] == [1, 2]
    assert "start-up: a fake launch" in (tmp_path / "log.txt").read_text()


def test_steady_steps_are_the_steps_after_the_first():
    run = [{"step": i + 1} for i in range(4)]
    assert [r["step"] for r in steady_records(run)] == [2, 3, 4]
    assert [r["step"] for r in steady_records(run[:1])] == [1]  # a run of one step: that one
    assert steady_records([]) == []


def test_a_launch_does_not_outlive_a_failure_of_its_watching(tmp_path, monkeypatch):
    # A bad metrics line (or a Ctrl-C) stops the watching: the launch's process group must go with it, or it keeps
    # the GPUs from the bench's next run.
    import os
    import signal

    import pytest
    import watched_launch as module

    command, run_dir = _fake(tmp_path, steps=2, ignore_term=True)
    started: list[int] = []
    real_popen = module.subprocess.Popen

    def popen(*args, **kwargs):
        proc = real_popen(*args, **kwargs)
        started.append(proc.pid)
        return proc

    def broken(_path):
        raise ValueError("a metrics line the bench cannot read")

    monkeypatch.setattr(module.subprocess, "Popen", popen)
    monkeypatch.setattr(module, "step_records", broken)
    with pytest.raises(ValueError):
        watched_launch(command, run_dir, steps=2, timeout_s=60, log_path=tmp_path / "log.txt", cwd=tmp_path)
    with pytest.raises(ProcessLookupError):
        os.killpg(started[0], signal.SIGKILL)  # the group is gone already
