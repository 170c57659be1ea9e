"""engine.rank_timeline: per-rank spans (nesting, CPU seconds, draining), the engine-step clock of the
vLLM backend, and the profiler's text summary (CPU only)."""

from __future__ import annotations

import gc
import time

import torch

from engine.rank_timeline import MAX_SPANS, RankTimeline, step_time_summary
from engine.rollout.vllm import EngineStepClock
from engine.workers.cluster.profiling import StepProfiler


def busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_nested_spans_record_full_names_wall_and_cpu_seconds():
    timeline = RankTimeline()
    with timeline.span("generate"):
        with timeline.span("engine") as record:
            busy(0.05)
            record["steps"] = 3
        time.sleep(0.05)  # wall, not CPU
        timeline.add("note", value=1.5)
    spans = timeline.drain()
    assert [s["span"] for s in spans] == ["generate/engine", "generate/note", "generate"]
    engine, note, outer = spans
    assert engine["steps"] == 3 and note["value"] == 1.5
    assert engine["thread_cpu_s"] >= 0.045 and engine["seconds"] >= engine["thread_cpu_s"] * 0.9
    assert outer["seconds"] >= engine["seconds"] + 0.045
    assert outer["thread_cpu_s"] < outer["seconds"] - 0.03  # the sleep took wall time, no CPU
    assert outer["start"] <= engine["start"] and abs(outer["start"] - time.time()) < 5
    assert timeline.drain() == []


def test_a_timeline_never_drained_keeps_the_newest_spans():
    timeline = RankTimeline()
    for index in range(MAX_SPANS + 5):
        timeline.add("tick", index=index)
    spans = timeline.drain()
    assert len(spans) == MAX_SPANS and spans[-1]["index"] == MAX_SPANS + 4 and spans[0]["index"] == 5


def test_step_time_summary_counts_stalls_over_twice_the_median():
    summary = step_time_summary([0.004] * 9 + [0.020])
    assert summary["steps"] == 10 and abs(summary["median_ms"] - 4.0) < 1e-9
    assert summary["slow_steps"] == 1 and abs(summary["slow_excess_s"] - 0.016) < 1e-9
    assert abs(summary["max_ms"] - 20.0) < 1e-9
    assert step_time_summary([]) == {"steps": 0}


class FakeEngine:
    def __init__(self, steps: int) -> None:
        self.left = steps

    def step(self) -> list[int]:
        self.left -= 1
        busy(0.002)
        return [self.left]

    def has_unfinished_requests(self) -> bool:
        return self.left > 0


def test_engine_step_clock_times_each_step_and_restores_the_method():
    engine = FakeEngine(5)
    with EngineStepClock(engine) as clock:
        while engine.has_unfinished_requests():
            engine.step()
    assert "step" not in vars(engine)  # the class's method again
    summary = clock.summary()
    assert summary["engine_steps"] == 5 and summary["engine_total_s"] >= 0.009
    assert summary["engine_thread_cpu_s"] >= 0.009


def test_engine_step_clock_times_the_garbage_collector_while_the_engine_runs():
    engine = FakeEngine(3)
    junk = []
    with EngineStepClock(engine) as clock:
        while engine.has_unfinished_requests():
            engine.step()
            junk.append([junk])  # a cycle: work for the collector
            gc.collect()  # a full collection, as the interpreter runs one when the old generation has grown
    gc.collect()  # after the block: not counted
    assert clock._on_gc not in gc.callbacks
    assert clock.gc_full_collections == 3 and clock.gc_seconds > 0
    metrics = clock.metrics()
    assert set(metrics) == {"engine_step_median", "engine_stalls", "engine_cpu", "engine_gc"}
    assert metrics["engine_gc"] == clock.gc_seconds and 0.001 < metrics["engine_step_median"] < 1.0
    assert clock.summary()["engine_gc_full"] == 3


def test_engine_step_clock_keeps_a_wrapper_the_instance_already_had():
    engine = FakeEngine(2)
    calls = []
    original = engine.step
    engine.step = lambda: calls.append(1) or original()
    wrapper = engine.step
    with EngineStepClock(engine) as clock:
        engine.step()
    assert engine.step is wrapper and calls == [1] and clock.summary()["engine_steps"] == 1


class Worker(StepProfiler):
    ROLE = "actor_rollout_ref"
    rank = 1


def test_profile_summary_lists_the_ops_and_ranges_of_the_recorded_block():
    worker = Worker()
    worker.start_profile()
    with torch.profiler.record_function("rlconf_range"):
        a = torch.randn(64, 64)
        (a @ a).sum()
    text = worker.stop_profile_summary(row_limit=20)
    assert text.startswith("# actor_rollout_ref rank 1")
    assert "aten::mm" in text and "rlconf_range" in text and "by own CPU time" in text
    assert worker._profiler is None
