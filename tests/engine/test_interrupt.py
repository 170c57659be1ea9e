"""Ctrl-C during `rlconf launch`: exit 130 with a message, and no Ray or worker process left behind.

The launch runs as a user starts it (the console command, in its own process group), and the test
sends SIGINT to the whole group once the first step is in metrics.jsonl, as a terminal's Ctrl-C does.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("ray")

ROOT = Path(__file__).resolve().parents[2]
RAY_PROCESS = "gcs_server|raylet|ray::|default_worker.py"


def _ray_processes() -> set[int]:
    found = subprocess.run(["pgrep", "-f", RAY_PROCESS], capture_output=True, text=True).stdout.split()
    return {int(pid) for pid in found}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("pgrep") is None or sys.platform != "linux", reason="needs pgrep (procps) on Linux")
def test_ctrl_c_stops_the_run_with_exit_130_and_leaves_no_ray_process(tmp_path: Path) -> None:
    rlconf = shutil.which("rlconf")
    if rlconf is None:
        pytest.skip("the rlconf console script is not on PATH (pip install -e .)")
    before = _ray_processes()
    run_dir = tmp_path / "run"
    env = dict(os.environ, RLCONF_CACHE_DIR=str(tmp_path / "cache"))
    proc = subprocess.Popen([rlconf, "launch", "presets/quickstart.yaml", "--run-dir", str(run_dir)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    metrics = run_dir / "metrics.jsonl"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.is_file() and metrics.read_text().strip():
            break
        time.sleep(0.2)
    assert proc.poll() is None, f"the launch ended before its first step: {proc.communicate()[0][-2000:]}"
    assert _ray_processes() - before, "no Ray process found while the run is going: the check below would be vacuous"
    interrupted = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    output, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130, output[-2000:]
    assert "interrupted" in output
    assert time.monotonic() - interrupted < 30
    left: set[int] = set()
    for _ in range(50):  # Ray's daemons exit just after the driver; give them a few seconds
        left = _ray_processes() - before
        if not left:
            break
        time.sleep(0.2)
    assert not left, subprocess.run(["ps", "-o", "pid,args", "-p", ",".join(map(str, left))],
                                    capture_output=True, text=True).stdout
