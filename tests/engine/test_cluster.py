"""`rlconf launch` on a Ray cluster of several nodes, made on one machine: three raylets of one CPU each.

With one CPU a node, the per-node placement groups of a `trainer.nnodes=2, n_gpus_per_node=1` plan
cannot share a node, so the two ranks land on two nodes; the tests read where from
`<run_dir>/workers.json`, which records what Ray reported inside each worker. Every node has the
address 127.0.0.1, so the ranks meet at rank 0's node as Ray names it, like on a real cluster.

The cluster lives in a private RAY_TMPDIR: Ray records the address of a cluster it starts in
`<tmp>/ray/ray_current_cluster`, where another `ray.init()` on this machine would find and join it.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path

import pytest

from tests.engine.launching import assert_learns, compile_preset, read_metrics
from tests.engine.processes import command_of, process_tree

pytest.importorskip("torch")
pytest.importorskip("ray")

LOOPBACK = "127.0.0.1"
STEPS = ["trainer.save_freq=-1"]  # the quickstart's 40 steps: enough to show the 2-node run learns
TWO_NODES = ["trainer.nnodes=2", "trainer.n_gpus_per_node=1"]  # world size 2, as the quickstart's 1 × 2
# Same seeds, same rows per rank, a 2-rank gloo all-reduce either way: the numbers agree to float32 noise.
COMPARED = ("reward/mean", "response_length/mean", "actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/ppo_kl")
REL_TOLERANCE, ABS_TOLERANCE = 1e-4, 1e-6
ACTOR_PROCESS = "ray::ActorRolloutRefWorker"


def placed_nodes(run_dir: Path) -> list[str]:
    """The Ray node id of each actor rank, as the workers reported it."""
    return [w["node_id"] for w in json.loads((run_dir / "workers.json").read_text())["actor_rollout_ref"]]


def actor_processes() -> list[int]:
    """Actor worker processes under this test process (the cluster's raylets are its children)."""
    return [pid for pid in process_tree(os.getpid()) if command_of(pid).startswith(ACTOR_PROCESS)]


@pytest.fixture(scope="module")
def one_node_metrics(quickstart_run) -> list[dict]:
    """The quickstart on a local one-node Ray (before the cluster exists: a local start would join it).

    The session's run of the shipped preset (tests/engine/conftest.py), which also checkpoints at steps 20
    and 40: that changes no metric compared here (checked: every metric but timings and memory is equal)."""
    _resolved, run_dir, code = quickstart_run
    assert code == 0
    return read_metrics(run_dir)


@pytest.fixture(scope="module")
def cluster(one_node_metrics: list[dict], tmp_path_factory: pytest.TempPathFactory):
    from ray.cluster_utils import Cluster

    from engine.launch import _loopback_node_ip, _no_dashboard_server_or_monitor

    ray_tmp = tempfile.mkdtemp(prefix="rlc-", dir="/tmp")  # short: Ray's socket paths have a length limit
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_TMPDIR", ray_tmp)
    mp.setenv("RLCONF_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    cluster = None
    try:
        # Without the dashboard server and the autoscaler monitor, as a local launch starts its head (about 3 s
        # less to start and stop the cluster on 2 cores); neither places, watches or stops workers.
        with _loopback_node_ip(), _no_dashboard_server_or_monitor():
            cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "node_ip_address": LOOPBACK,
                                                                    "include_dashboard": False})
            for _ in range(2):
                cluster.add_node(num_cpus=1, node_ip_address=LOOPBACK)
        cluster.wait_for_nodes()
        yield cluster
    finally:
        if cluster is not None:
            cluster.shutdown()
        mp.undo()
        shutil.rmtree(ray_tmp, ignore_errors=True)


@pytest.mark.slow
def test_a_local_run_listens_on_loopback_only(quickstart_cli_run) -> None:
    """Every listening TCP socket of `rlconf launch` and its process tree (Ray, workers) while it trains
    (the session's launch of README's command, tests/engine/conftest.py).

    Runs before the cluster tests of this module: a local start would join their cluster."""
    run = quickstart_cli_run
    assert run.returncode == 0, run.output[-2000:]
    assert any(ACTOR_PROCESS in listener.command for listener in run.listeners), \
        "no actor worker socket seen: the rendezvous store should be among them"
    exposed = sorted(f"{listener.ip}:{listener.port} ({listener.command[:60]})" for listener in run.listeners
                     if not listener.on_loopback)
    assert exposed == []


@pytest.mark.slow
def test_quickstart_on_two_nodes_puts_a_rank_on_each_and_matches_the_one_node_run(cluster, one_node_metrics,
                                                                                   tmp_path: Path) -> None:
    from engine.launch import run_launch

    resolved = compile_preset("quickstart.yaml", [*TWO_NODES, *STEPS])
    assert run_launch(resolved, run_dir=tmp_path, address=cluster.address) == 0

    nodes = placed_nodes(tmp_path)
    assert len(set(nodes)) == 2, f"both ranks on one node: {nodes}"
    assert set(nodes) <= {node.node_id for node in cluster.list_all_nodes()}
    two_node_metrics = read_metrics(tmp_path)
    print("largest difference to the one-node run:", {key: max(abs(one[key] - two[key]) for one, two in
                                                               zip(one_node_metrics, two_node_metrics)) for key in COMPARED})
    steps = resolved.config.trainer.total_training_steps
    assert [m["step"] for m in two_node_metrics] == [m["step"] for m in one_node_metrics] == list(range(1, steps + 1))
    for one, two in zip(one_node_metrics, two_node_metrics):
        for key in COMPARED:
            assert two[key] == pytest.approx(one[key], rel=REL_TOLERANCE, abs=ABS_TOLERANCE), (two["step"], key)
    # It learns, by the quickstart's criterion (tests/engine/test_grpo_e2e.py).
    assert_learns(two_node_metrics)


@pytest.mark.slow
def test_losing_a_node_stops_the_run_within_60s_naming_it_and_a_resume_finishes_on_the_other_nodes(
        cluster, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from engine.launch import EXIT_FAILED, run_launch

    resolved = compile_preset("quickstart.yaml", [*TWO_NODES, "trainer.total_training_steps=6", "trainer.save_freq=2"])
    run_dir = tmp_path / "run"
    killed: dict = {}

    def kill_a_node_running_a_rank() -> None:
        metrics, deadline = run_dir / "metrics.jsonl", time.monotonic() + 180
        while time.monotonic() < deadline:  # step 3 is past the checkpoint of step 2
            if metrics.is_file() and len(metrics.read_text().splitlines()) >= 3:
                break
            time.sleep(0.05)
        else:
            return
        victim = next(node for node in cluster.worker_nodes if node.node_id in placed_nodes(run_dir))
        killed.update(node_id=victim.node_id, at=time.monotonic())
        cluster.remove_node(victim, allow_graceful=False)

    killer = threading.Thread(target=kill_a_node_running_a_rank, daemon=True)
    killer.start()
    code = run_launch(resolved, run_dir=run_dir, address=cluster.address)
    stopped = time.monotonic()
    killer.join(timeout=10)
    output = capsys.readouterr().err
    assert killed, f"the run ended before a node could be killed: {output[-2000:]}"
    assert code == EXIT_FAILED, output[-2000:]
    assert stopped - killed["at"] <= 60
    failure = next(line for line in output.splitlines() if line.startswith("error: worker"))
    assert "actor_rollout_ref" in failure and killed["node_id"][:12] in failure, failure
    stop_report = f"stopped {stopped - killed['at']:.1f}s after node {killed['node_id'][:12]} was killed: {failure}"
    for _ in range(100):  # the surviving rank's process ends once the driver has let go of it
        if not actor_processes():
            break
        time.sleep(0.1)
    assert actor_processes() == [], "an actor worker outlived the failed run"

    assert run_launch(resolved, run_dir=run_dir, address=cluster.address) == 0  # trainer.resume_mode=auto
    output = capsys.readouterr().err
    assert "resumed from" in output and "global_step_2" in output, output[-2000:]
    assert [m["step"] for m in read_metrics(run_dir)] == [1, 2, 3, 4, 5, 6]
    nodes = placed_nodes(run_dir)
    assert len(set(nodes)) == 2 and killed["node_id"] not in nodes
    print(stop_report)


def test_the_loopback_address_is_on_the_lo_interface() -> None:
    from engine.workers.cluster.device import interface_of

    assert interface_of(LOOPBACK) == "lo"
    assert interface_of("192.0.2.254") is None  # TEST-NET-1: on no interface of this machine


def test_the_shared_dir_probe_reports_a_directory_the_worker_does_not_see(tmp_path: Path) -> None:
    from engine.workers.cluster.rendezvous import probe_shared_dir, write_probe

    probe, token = write_probe(tmp_path)
    assert probe_shared_dir(None, str(probe), token, str(tmp_path / "reply")) is None
    assert (tmp_path / "reply").read_text() == token
    assert "reads a different" in probe_shared_dir(None, str(probe), "another-token", str(tmp_path / "reply"))
    assert "cannot read" in probe_shared_dir(None, str(tmp_path / "elsewhere" / probe.name), token, str(tmp_path / "r"))


def test_a_worker_failure_names_the_node() -> None:
    from engine.workers.cluster.failure import WorkerFailure

    failure = WorkerFailure("actor_rollout_ref", 1, RuntimeError("boom"), "10.0.0.2 (Ray node 3f1b1f887670)")
    assert str(failure) == "worker actor_rollout_ref rank 1 on node 10.0.0.2 (Ray node 3f1b1f887670) failed: boom"
