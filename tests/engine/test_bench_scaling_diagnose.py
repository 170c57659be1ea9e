"""bench/scaling_diagnose.py and bench/host_contention.py: the parts that decide what the one GPU run
measures (CPU sets, the schedule, the driver's serial generate, the tables), and a CPU run of the whole
diagnostic over two Ray workers with HF generate (slow)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from bench_scripts import BENCH, bench_module

pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]

diagnose = bench_module("scaling_diagnose")
host = bench_module("host_contention")


def test_cpu_list_parsing():
    assert diagnose.parse_cpu_list("0-3,8,10-11\n") == [0, 1, 2, 3, 8, 10, 11]


def test_cpu_sets_give_each_rank_its_own_physical_cores_on_its_numa_node():
    # 2 nodes of 4 cores with SMT siblings c and c+16; both GPUs on node 1.
    siblings = {c: c % 16 for c in range(32)}
    node1 = [*range(8, 16), *range(24, 32)]
    ranks = [{"allowed": list(range(32)), "numa_cpus": node1, "siblings": siblings} for _ in range(2)]
    first, second = diagnose.cpu_sets(ranks, cores_per_rank=4)
    assert not set(first) & set(second)
    assert set(first) <= set(node1) and set(second) <= set(node1)
    assert {c % 16 for c in first} == {8, 9, 10, 11} and len(first) == 8  # four cores with both threads
    # An unknown node (a VM): the allowed CPUs, split so that nobody is left without one.
    small = [{"allowed": [0, 1], "numa_cpus": [], "siblings": {}} for _ in range(2)]
    assert diagnose.cpu_sets(small) == [[0], [1]]


def test_the_schedule_is_checked_before_anything_starts():
    assert diagnose.parse_schedule("base, base,serial_gen", 2, 1) == ["base", "base", "serial_gen"]
    with pytest.raises(SystemExit, match="unknown variant"):
        diagnose.parse_schedule("base,fast", 1, 1)
    with pytest.raises(SystemExit, match="serial_gen needs"):
        diagnose.parse_schedule("base,serial_gen", 2, 2)
    with pytest.raises(SystemExit, match="at least 2"):
        diagnose.parse_schedule("base", 1, 1)


class FakeGroup:
    """RayWorkerGroup's calls as the diagnostic makes them: rank r answers shard × 10."""

    world_size = 2

    def __init__(self) -> None:
        self.log: list = []

    def submit_to(self, rank, method, shard):
        self.log.append(("sent", rank))
        return [(rank, shard)]

    def submit_sharded(self, method, shards):
        return [ref for rank, shard in enumerate(shards) for ref in self.submit_to(rank, method, shard)]

    def collect(self, refs):
        self.log.append(("waited", [rank for rank, _ in refs]))
        return [shard * 10 for _, shard in refs]

    def call_sharded(self, method, shards):
        return self.collect(self.submit_sharded(method, shards))


def test_serial_generate_waits_for_each_replica_before_sending_the_next():
    group = diagnose.TimedGroup(FakeGroup())
    assert group.call_sharded("generate", [1, 2]) == [10, 20]
    assert group.inner.log == [("sent", 0), ("sent", 1), ("waited", [0, 1])]
    group.inner.log.clear()
    group.serial_generate = True
    assert group.call_sharded("generate", [1, 2]) == [10, 20]
    assert group.inner.log == [("sent", 0), ("waited", [0]), ("sent", 1), ("waited", [1])]
    assert [c["serial"] for c in group.calls] == [False, True] and group.world_size == 2


def step(number, variant, generate, ranks):
    return {"step": number, "variant": variant, "metrics": {"timing/step": generate + 1, "timing/generate": generate},
            "ranks": [{"rank": r, "spans": [{"span": "generate", "start": 100.0 + r * skew, "seconds": s},
                                            {"span": "generate/engine", "start": 100.0, "seconds": s - 0.1,
                                             "engine_median_ms": 4.0}]}
                      for r, (s, skew) in enumerate(ranks)]}


def test_tables_take_medians_of_the_steady_steps_per_rank_and_the_dispatch_skew():
    result = {"gpus": 2, "steps": [step(1, "base", 50.0, [(49, 0), (49, 0)]), step(2, "base", 2.0, [(1.8, 0.01), (1.9, 0.01)]),
                                   step(3, "base", 3.0, [(2.8, 0.03), (2.9, 0.03)]),
                                   step(4, "no_sleep", 9.0, [(9, 0), (9, 0)]), step(5, "no_sleep", 1.5, [(1.4, 0), (1.4, 0)])]}
    base = diagnose.median_table(result, "base")
    assert base["steps"] == [2, 3] and base["timing/generate"] == 2.5  # the warm-up left out
    assert base["rank1/generate/seconds"] == pytest.approx(2.4) and base["rank0/generate/engine/engine_median_ms"] == 4.0
    assert base["generate_start_skew_s"] == pytest.approx(0.02)
    assert diagnose.median_table(result, "no_sleep")["steps"] == [5]  # its first step still woke up
    text = diagnose.report({"configs": {"2gpu_tp1": result}})
    assert "2gpu_tp1:base" in text and "rank1 generate" in text


def test_nccl_transport_lines_are_kept():
    log = "x NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\nnoise\nx NCCL INFO NCCL version 2.27.3\n"
    assert len(host.nccl_transport_lines(log)) == 2


@pytest.mark.slow
def test_a_cpu_run_of_the_diagnostic_measures_every_variant(tmp_path):
    overrides = ["trainer.device=cpu", "actor_rollout_ref.rollout.name=hf", "actor_rollout_ref.model.path=tiny://qwen2",
                 "actor_rollout_ref.model.dtype=float32", "actor_rollout_ref.rollout.dtype=float32",
                 "data.max_response_length=4", "data.max_prompt_length=32",
                 "actor_rollout_ref.model.enable_gradient_checkpointing=false"]
    proc = subprocess.run([sys.executable, str(BENCH / "scaling_diagnose.py"), "--configs", "2gpu_tp1", "--no-knobs",
                           "--skip-host", "--out", str(tmp_path), "--schedule-2gpu",
                           "base,base,profile,serial_gen,pin,no_sleep,no_sleep", *overrides],
                          capture_output=True, text=True, timeout=600, cwd=ROOT,
                          env=dict(os.environ, PYTHONPATH=str(ROOT), RAY_AUTH_MODE="disabled"))
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads((tmp_path / "diagnose.json").read_text())["configs"]["2gpu_tp1"]
    assert [s["variant"] for s in result["steps"]] == ["base", "base", "profile", "serial_gen", "pin", "no_sleep",
                                                       "no_sleep"]
    serial = result["steps"][3]
    assert [c.get("serial") for c in serial["driver_calls"] if c["method"] == "generate"] == [True]
    for record in result["steps"][1:]:
        assert {r["rank"] for r in record["ranks"]} == {0, 1}
        names = {s["span"] for r in record["ranks"] for s in r["spans"]}
        assert {"generate", "update_actor", "update_actor/micro_batches", "weight_sync"} <= names
    profile = (tmp_path / "profile_2gpu_tp1.txt").read_text()
    assert "# actor_rollout_ref rank 0" in profile and "# actor_rollout_ref rank 1" in profile
    assert "2gpu_tp1:serial_gen" in (tmp_path / "diagnose.txt").read_text()


def test_gc_freeze_freezes_the_heap_for_the_rollouts_generate_only():
    import gc
    from types import SimpleNamespace

    class Backend:
        def generate(self, prompts):
            return prompts, gc.get_freeze_count()

    worker = SimpleNamespace(rollout=Backend())
    assert worker.rollout.generate(1)[1] == 0
    assert diagnose.set_gc_freeze(worker, True) is True
    prompts, frozen = worker.rollout.generate(2)
    assert prompts == 2 and frozen > 0 and gc.get_freeze_count() == 0  # frozen while it ran, not after
    assert diagnose.set_gc_freeze(worker, False) is False
    assert "generate" not in vars(worker.rollout) and worker.rollout.generate(3) == (3, 0)
