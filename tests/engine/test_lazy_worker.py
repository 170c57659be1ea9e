"""engine.workers.cluster.lazy on a real (local, CPU) Ray cluster: a worker group spawned by the worker's module
and class name, built later, its methods and attributes reached through the actor; the launch's GPU count without
torch (engine.launch.gpu_count, rlconf.device.local_gpu_count)."""

from __future__ import annotations

import os
import sys

import pytest

from engine.workers.cluster.lazy import LazyWorker, build, invoke, spec_name

ray = pytest.importorskip("ray")


class Counter:
    """A stand-in worker (this module is importable in Ray's workers: tests/ is on their path)."""

    def __init__(self, start: int, rank: int, world_size: int, num_threads: int = 1) -> None:
        self.value, self.rank, self.world_size = start, rank, world_size

    def add(self, amount: int) -> int:
        self.value += amount
        return self.value

    def fail(self) -> None:
        raise ValueError(f"rank {self.rank} refuses")

    def spin(self, limit_s: float) -> float:
        """Busy until `stop` is called (from the control thread) or `limit_s` passes; the seconds it spun."""
        import threading
        import time

        self.stopped = getattr(self, "stopped", None) or threading.Event()
        started = time.perf_counter()
        while not self.stopped.is_set() and time.perf_counter() - started < limit_s:
            time.sleep(0.005)
        return time.perf_counter() - started

    def count_up(self, until: int, gate: str) -> object:
        """Yields start, start + 1, ... up to `until`; after the first, waits until the file `gate` exists."""
        import time
        from pathlib import Path

        for value in range(self.value, until + 1):
            yield value
            while not Path(gate).exists():
                time.sleep(0.01)
        if until < 0:
            raise ValueError("never")

    def stop(self) -> bool:
        import threading

        self.stopped = getattr(self, "stopped", None) or threading.Event()
        self.stopped.set()
        return True


def test_the_shim_imports_the_class_builds_it_later_and_forwards_attributes() -> None:
    shim = LazyWorker((__name__, "Counter"))
    with pytest.raises(AttributeError, match="not built yet"):
        shim.value  # noqa: B018 - the attribute read is the test
    assert build(shim, {"start": 5, "rank": 1, "world_size": 2}) == "Counter"
    assert invoke(shim, "add", 3) == 8 and shim.value == 8 and shim.rank == 1
    assert spec_name((__name__, "Counter")) == "Counter" and spec_name(Counter) == "Counter"
    assert LazyWorker(Counter)._cls is Counter  # a class object works as well as its name
    # Modules preloaded for later; one that cannot be imported is left for the worker to report when it needs it.
    assert LazyWorker(Counter, ("json", "no_such_module_here"))._cls is Counter and "json" in sys.modules
    shim.value = 1  # set through the actor (as bench/scaling_diagnose's functions do): the worker's own
    assert shim._worker.value == 1 and "value" not in vars(shim) and invoke(shim, "add", 1) == 2


@pytest.fixture(scope="module")
def local_ray():
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}})
    yield
    ray.shutdown()


def test_a_group_spawned_by_name_is_built_with_the_arguments_given_later(local_ray) -> None:
    from engine.workers.cluster.failure import WorkerFailure
    from engine.workers.cluster.group import RayWorkerGroup

    group = RayWorkerGroup.spawned((__name__, "Counter"), "actor_rollout_ref", 2)
    group.start(start=10)  # the constructor's arguments, known only now; rank and world size added per rank
    assert group.call_all("add", 1) == [11, 11]
    assert group.call_sharded("add", [1, 2]) == [12, 13]
    assert group.collect(group.submit_to(1, "add", 5)) == [18]
    assert len({where.pid for where in group.locations}) == 2  # a process each
    with pytest.raises(WorkerFailure, match="actor_rollout_ref"):
        group.call_all("fail")
    group.kill()


def test_a_streamed_call_answers_each_item_while_the_worker_is_still_running(local_ray, tmp_path) -> None:
    """The fully async schedule's streamed calls (engine.controller.fully_async.StreamedCall): a group reaches the
    controller as its worker yields it, not when the call ends."""
    from engine.workers.cluster.failure import WorkerFailure
    from engine.workers.cluster.group import RayWorkerGroup

    group = RayWorkerGroup((__name__, "Counter"), "rollout", 2, start=5)
    gate = tmp_path / "gate"
    streams = group.submit_streamed("count_up", [7, 6], str(gate))
    # both workers wait at their gate after their first item: the first items arrive before either call ends
    assert sorted(group.next_from(rank, stream) for rank, stream in enumerate(streams)) == [5, 5]
    gate.touch()
    ready = group.first_ready(streams)
    assert ready in (0, 1)
    assert [group.next_from(0, streams[0]) for _ in range(2)] == [6, 7]
    assert group.next_from(1, streams[1]) == 6
    for rank, stream in enumerate(streams):
        with pytest.raises(StopIteration):
            group.next_from(rank, stream)
    failing = group.submit_streamed("count_up", [-1, -1], str(gate))
    with pytest.raises(WorkerFailure, match="worker rollout rank 1"):
        group.next_from(1, failing[1])
    group.kill()


def test_a_signal_reaches_a_worker_in_the_middle_of_a_call_only_with_a_control_thread(local_ray) -> None:
    """Partial rollouts: a weight push interrupts the rollout pool's generation (RayWorkerGroup.signal_all)."""
    import time

    from engine.workers.cluster.group import RayWorkerGroup

    group = RayWorkerGroup((__name__, "Counter"), "rollout", 1, control=True, start=0)
    running = group.submit_all("spin", 60.0)
    queued = group.submit_all("add", 1)  # calls still run one at a time, in order
    time.sleep(0.5)
    assert group.signal_all("stop") == [True]
    assert group.collect(running)[0] < 30 and group.collect(queued) == [1]
    group.kill()
    plain = RayWorkerGroup((__name__, "Counter"), "rollout", 1, start=0)
    with pytest.raises(RuntimeError, match="without a control thread"):
        plain.signal_all("stop")
    plain.kill()


def test_the_factory_builds_the_spawned_group_only_for_the_class_it_was_spawned_for(local_ray, monkeypatch) -> None:
    from engine.workers.cluster import placement

    class Factory(placement.WorkerGroupFactory):
        def _slots(self, role):
            return "global", 1, 0

    factory = Factory(resolved=None, run_dir=None, sharing={}, bundles={"global": None})
    factory.spawn((__name__, "Counter"), "actor_rollout_ref", 1)
    spawned = factory._spawned["actor_rollout_ref"]
    assert factory(Counter, "actor_rollout_ref", 1, start=3) is spawned  # the same class: built, not respawned
    assert spawned.call_all("add", 0) == [3]

    class Other(Counter):
        pass

    factory.spawn((__name__, "Counter"), "actor_rollout_ref", 1)
    again = factory._spawned["actor_rollout_ref"]
    group = factory(Other, "actor_rollout_ref", 1, start=4)  # another class than foreseen: a new group of it
    assert group is not again and group.class_name == "Other" and group.call_all("add", 1) == [5]
    for g in (spawned, group):
        g.kill()


def test_the_gpu_count_reads_nvidia_smi_and_cuda_visible_devices_without_torch(tmp_path, monkeypatch) -> None:
    import engine.launch
    from rlconf.device import local_gpu_count

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf '0\\n1\\n2\\n3\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert local_gpu_count() == 4 and engine.launch.gpu_count() == 4
    for visible, count in (("1,3", 2), ("", 0), ("2,-1,3", 1), ("0,1,2,3,4,5", 4), ("0,7,1", 1), ("0,0", 0),
                           ("1,1,2", 0), (" 2 , 3", 2), ("GPU-5d1c,GPU-77aa", None), ("NoDevFiles", None),
                           ("MIG-1234", None)):
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        assert local_gpu_count() == count, visible
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    smi.write_text("#!/bin/sh\nexit 9\n")  # a driver that does not answer: torch is asked instead
    assert local_gpu_count() is None
    monkeypatch.setattr("torch.cuda.device_count", lambda: 7)
    assert engine.launch.gpu_count() == 7
