"""Shared fixtures for engine tests."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen2 checkpoint + tokenizer, built once per test session.

    Building is offline and takes about a second; sharing it keeps the engine
    suite fast. Tests must treat the directory as read-only.
    """
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from engine.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), arch="qwen2")


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, int]:
    """`presets/quickstart.yaml` as shipped (40 GRPO steps) through `run_launch`, once per session:
    (resolved plan, run dir, exit code).

    tests/engine/test_grpo_e2e.py reads what it left; tests/engine/test_cluster.py compares its two-node
    run with its metrics. One launch of the same plan instead of two saves about 35 s (checked: with
    trainer.save_freq=-1 the 40 lines of metrics.jsonl are equal, timings and memory aside).
    """
    from launching import launch_preset

    return launch_preset(tmp_path_factory, "quickstart", "quickstart.yaml")


@dataclass(frozen=True)
class CliRun:
    returncode: int
    output: str  # stdout and stderr, interleaved as a terminal shows them
    listeners: frozenset  # tests/engine/processes.py's Listener of every listening TCP socket of the launch's tree


@pytest.fixture(scope="session")
def quickstart_cli_run(tmp_path_factory: pytest.TempPathFactory) -> CliRun:
    """README's first command as a user runs it: the `rlconf` console command in the repository root,
    `rlconf launch presets/quickstart.yaml`, 4 steps of it, in a process of its own with a local Ray
    cluster. From its first metrics line to its exit, every listening TCP socket of its process tree
    (Ray, workers) is recorded.

    tests/engine/test_launch_messages.py checks that it prints no warning, tests/engine/test_cluster.py
    that it listens on loopback only: one launch instead of two (31 s -> 20 s for the two tests on 2 cores).
    """
    pytest.importorskip("torch")
    pytest.importorskip("ray")
    from processes import listening_sockets, process_tree

    tmp = tmp_path_factory.mktemp("quickstart_cli")
    rlconf = shutil.which("rlconf") or str(Path(sys.executable).with_name("rlconf"))
    run_dir, log = tmp / "run", tmp / "output.txt"
    env = dict(os.environ, RLCONF_CACHE_DIR=str(tmp / "cache"))
    env.pop("RAY_ADDRESS", None)  # a local run, not a job's driver
    with log.open("w") as out:  # a file, not a pipe: nothing blocks the launch while it is watched
        proc = subprocess.Popen([rlconf, "launch", "presets/quickstart.yaml", "trainer.total_training_steps=4",
                                 "--run-dir", str(run_dir)], cwd=Path(__file__).resolve().parents[2], env=env,
                                stdout=out, stderr=subprocess.STDOUT, text=True)
        try:
            listeners = set()
            metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 600
            while time.monotonic() < deadline and proc.poll() is None:
                if metrics.is_file() and metrics.read_text().strip():  # workers are up and have met
                    listeners |= set(listening_sockets(process_tree(proc.pid)))
                time.sleep(0.2)
            proc.wait(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return CliRun(proc.returncode, log.read_text(), frozenset(listeners))


@pytest.fixture(scope="module")
def ray_address() -> Any:
    """The address of a local Ray cluster (loopback, no dashboard) that the module's end-to-end launches
    join (`run_launch(..., address=...)`, as `rlconf launch --address` does) instead of each starting and
    stopping a cluster of its own (a local start and its shutdown took 6 s of an 11 s two-step quickstart
    launch on 2 idle cores; joining, 0.02 s of 5 s).

    For launches whose tests check what a run does (learning, checkpoints, resume, failures), not how
    Ray starts: the local start stays covered by the `quickstart_run` and `quickstart_cli_run` launches
    and tests/engine/test_interrupt.py. One cluster a module, not a session: its processes (children of
    this one) are gone before tests that look at this process's children run (tests/engine/test_start_ray.py,
    tests/engine/test_cluster.py). It lives in a private RAY_TMPDIR, so no `ray.init()` elsewhere on the
    machine finds it (as tests/engine/test_cluster.py's cluster does).
    """
    import tempfile

    pytest.importorskip("ray")
    from ray.cluster_utils import Cluster

    from engine.launch import _loopback_node_ip, _no_dashboard_server_or_monitor

    ray_tmp = tempfile.mkdtemp(prefix="rlc-", dir="/tmp")  # short: Ray's socket paths have a length limit
    cluster = None
    module_env = pytest.MonkeyPatch()
    # The cluster's processes and this driver must agree on Ray's token authentication. A local start sets
    # RAY_AUTH_MODE=token in this process when it is unset, after which joining a cluster started without it
    # fails ("the actor never ran"); pinned for the module, a local start there keeps the mode too.
    module_env.setenv("RAY_AUTH_MODE", os.environ.get("RAY_AUTH_MODE") or "disabled")
    try:
        with pytest.MonkeyPatch.context() as mp, _loopback_node_ip(), _no_dashboard_server_or_monitor():
            mp.setenv("RAY_TMPDIR", ray_tmp)
            # 8 CPUs: room for the largest CPU plan launched this way (6 worker processes, +1 as a local start has).
            # An object store of 1 GiB, not Cluster's 150 MiB default: no launch here spills what a local start
            # (30% of the memory) would hold.
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 8, "node_ip_address": "127.0.0.1",
                                                                    "include_dashboard": False,
                                                                    "object_store_memory": 1 << 30})
            cluster.wait_for_nodes()
        yield cluster.address
    finally:
        if cluster is not None:
            cluster.shutdown()
        module_env.undo()
        shutil.rmtree(ray_tmp, ignore_errors=True)
