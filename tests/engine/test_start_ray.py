"""`rlconf launch` without --address starts a Ray cluster of its own, whatever cluster the machine knows of.

ray.init() with no address joins the cluster RAY_ADDRESS or /tmp/ray/ray_current_cluster names (a
stray one, another user's test run) and then refuses num_cpus; a local run must not depend on that.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("ray")


def test_a_local_start_asks_ray_for_a_new_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from engine.launch import start_ray

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    start_ray(None, dashboard=False, num_cpus=3)
    assert calls[0]["address"] == "local" and calls[0]["num_cpus"] == 3
    start_ray("10.0.0.1:6379", dashboard=False, num_cpus=3)
    assert calls[1]["address"] == "10.0.0.1:6379" and "num_cpus" not in calls[1]


RAYLET_TIMEOUT = ("The current node timed out during startup. This could happen because some of the raylet "
                  "failed to startup or the GCS has become overloaded.")  # Ray 2.60's words (ray/_private/node.py)


def _init_that_times_out(times: int, calls: list[Any]) -> Any:
    """A ray.init that starts a process through Ray's Popen (as the GCS and raylet are started), then raises
    Ray's start-up timeout the first `times` calls."""
    from ray._private import services

    def init(**kwargs: Any) -> None:
        process = services.ConsolePopen([sys.executable, "-c", "import time; time.sleep(120)"])
        calls.append(process)
        if len(calls) <= times:
            raise Exception(RAYLET_TIMEOUT)

    return init


@pytest.mark.skipif(sys.platform != "linux", reason="process groups")
def test_a_local_start_that_times_out_stops_what_it_started_and_starts_once_more(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from engine.launch import start_ray

    calls: list[Any] = []
    said: list[str] = []
    monkeypatch.setattr(ray, "init", _init_that_times_out(1, calls))
    monkeypatch.setattr(ray, "shutdown", lambda: said.append("shutdown"))
    start_ray(None, dashboard=False, num_cpus=1, say=said.append)
    try:
        assert len(calls) == 2
        assert calls[0].poll() is not None  # the first start's process is gone (killed and reaped)
        assert calls[1].poll() is None  # the second start's stays: it is the cluster now
        assert said[0] == "shutdown" and "timed out waiting for its raylet" in said[1] and "2 of 2" in said[1]
        assert "failed" not in said[1]  # the launch goes on: launches that end well say no "failed" (test_interrupt)
    finally:
        calls[1].kill()
        calls[1].wait()


@pytest.mark.skipif(sys.platform != "linux", reason="process groups")
def test_a_local_start_gives_up_after_its_second_timeout_and_other_errors_are_not_retried(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from engine.launch import LOCAL_RAY_STARTS, start_ray

    calls: list[Any] = []
    monkeypatch.setattr(ray, "init", _init_that_times_out(LOCAL_RAY_STARTS, calls))
    monkeypatch.setattr(ray, "shutdown", lambda: None)
    with pytest.raises(Exception, match="timed out during startup"):
        start_ray(None, dashboard=False, num_cpus=1)
    assert len(calls) == LOCAL_RAY_STARTS
    assert all(process.poll() is not None for process in calls)  # the last start's processes are stopped too

    def refused(**kwargs: Any) -> None:
        calls.append(kwargs)
        raise ValueError("num_cpus must be a positive integer")

    calls.clear()
    monkeypatch.setattr(ray, "init", refused)
    with pytest.raises(ValueError):
        start_ray(None, dashboard=False, num_cpus=1)
    assert len(calls) == 1


@pytest.fixture(scope="module")
def local_start() -> dict[str, Any]:
    """One local start as a launch without --dashboard makes it, with RAY_ADDRESS naming a cluster that is
    not there: the CPUs of the cluster it joined and the command lines of the processes under this one
    (Ray's are its children). The tests below share it: a start costs about 5 s."""
    import ray

    from engine.launch import start_ray
    from tests.engine.processes import command_of, process_tree

    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RAY_ADDRESS", "127.0.0.1:1")  # nothing listens there
        start_ray(None, dashboard=False, num_cpus=1)
        try:
            return {"cpus": ray.cluster_resources().get("CPU"),
                    "commands": [command_of(pid) for pid in process_tree(os.getpid())]}
        finally:
            ray.shutdown()


@pytest.mark.slow
def test_a_local_start_ignores_ray_address_in_the_environment(local_start: dict[str, Any]) -> None:
    assert local_start["cpus"] == 1  # ours: the one CPU it asked for


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="reads /proc for Ray's processes")
def test_a_local_start_without_the_dashboard_runs_no_dashboard_server_or_autoscaler_monitor(
        local_start: dict[str, Any]) -> None:
    """Both would cost every launch about 2.7 s on 2 cores (engine.launch._no_dashboard_server_or_monitor);
    the processes a run needs are there."""
    commands = local_start["commands"]
    started = {name for name in ("gcs_server", "raylet", "log_monitor.py", "dashboard/dashboard.py",
                                 "autoscaler/_private/monitor.py") if any(name in command for command in commands)}
    assert started == {"gcs_server", "raylet", "log_monitor.py"}, commands


def test_a_local_start_with_the_dashboard_leaves_rays_head_processes_as_they_are(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray
    from ray._private import node

    from engine.launch import start_ray

    own = (node.Node.start_api_server, node.Node.start_monitor)
    seen: list[tuple[Any, Any]] = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: seen.append((node.Node.start_api_server, node.Node.start_monitor)))
    start_ray(None, dashboard=True, num_cpus=1)
    start_ray(None, dashboard=False, num_cpus=1)
    assert seen[0] == own and seen[1][0] != own[0] and seen[1][1] != own[1]
    assert (node.Node.start_api_server, node.Node.start_monitor) == own  # restored after ray.init


# Run in a session of its own: the Ctrl-C it sends goes to its process group, not pytest's.
FORK_WINDOW_SCRIPT = r"""
import json, os, signal, subprocess, sys, time
from ray._private import services
from engine.interrupt import SIGNALS, owned_signals
from engine.launch import _own_process_group

real_setpgid = os.setpgid

def ctrl_c_then_setpgid(pid, pgrp):  # runs in the forked child, still in the launch's group
    os.killpg(os.getpgrp(), signal.SIGINT)
    time.sleep(0.05)  # a handler the fork still runs would run here, in the fork, and read the driver's pipe
    with open(os.environ["FORK_COUNT_FILE"], "w") as f:
        f.write(str(signals.count))  # the fork's copy of the driver's StopSignals
    real_setpgid(pid, pgrp)

report = ("import json, os, signal; print(json.dumps([os.getpgrp() == os.getpid(), "
          "sorted(signal.pthread_sigmask(signal.SIG_BLOCK, [])), sorted(signal.sigpending())]))")
with owned_signals() as signals:
    os.setpgid = ctrl_c_then_setpgid
    try:
        with _own_process_group():
            child = services.ConsolePopen([sys.executable, "-c", report], stdout=subprocess.PIPE, text=True)
    finally:
        os.setpgid = real_setpgid
    out, _ = child.communicate()
    time.sleep(0.1)  # the handler for the driver's copy of the signal runs within this sleep
    print(json.dumps({"count": signals.count, "first": signals.first, "child_exit": child.returncode,
                      "child": json.loads(out) if out else None,
                      "handled_in_fork": int(open(os.environ["FORK_COUNT_FILE"]).read())}))
"""


def test_a_ctrl_c_while_a_ray_process_is_forked_reaches_the_driver_once_and_not_the_child(tmp_path: Path) -> None:
    """A Ctrl-C sent between the fork and the child's setpgid (the test puts it there on purpose) is
    one signal for the driver. Unblocked, the fork ran the driver's Python handler, which reads the
    driver's wakeup pipe (it could take the driver's own byte, and so its Ctrl-C) and could raise
    inside preexec_fn. The child starts in its own group with nothing pending and nothing blocked."""
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run([sys.executable, "-c", FORK_WINDOW_SCRIPT], cwd=root, capture_output=True, text=True,
                          timeout=60, start_new_session=True,
                          env={k: v for k, v in dict(os.environ, PYTHONPATH=str(root),
                                                     FORK_COUNT_FILE=str(tmp_path / "fork_count")).items()
                               if k != "RLCONF_INJECT_SIGNAL"})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    own_group, blocked, pending = result["child"]
    assert result["handled_in_fork"] == 0, result  # the fork ran no handler of the driver's
    assert result["count"] == 1 and result["first"] == 2, result  # 2: SIGINT, counted once
    assert result["child_exit"] == 0, result  # -2 would be the child killed by the Ctrl-C
    assert own_group and pending == [] and not {2, 15} & set(blocked), result
