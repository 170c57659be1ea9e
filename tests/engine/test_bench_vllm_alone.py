"""bench/vllm_alone.py on the CPU: the heap it adds, the function timers' fallback, the table, and its `--driver`
run (the launch's steps before Ray, each timed); the engine rounds themselves need a GPU and vLLM."""

from __future__ import annotations

import gc
import os
import subprocess
import sys

import pytest
from bench_scripts import BENCH, bench_module

pytest.importorskip("torch")

alone = bench_module("vllm_alone")


def test_the_junk_heap_holds_that_many_collector_tracked_objects_in_cycles():
    heap = alone.junk_heap(10_000)
    assert len(heap) == 5_000 and heap[7]["self"][0] is heap[7]  # a dict and the list that points back at it
    assert all(gc.is_tracked(node) and gc.is_tracked(node["self"]) for node in heap)  # what a collection walks


def test_timers_skip_what_this_vllm_lacks_and_say_so():
    records: list[dict] = []
    missing = alone.time_functions(records)  # no vLLM here: every target is missing, none wrapped
    assert len(missing) == len(alone.TIMED) and records == []


def test_the_table_shows_every_round_and_a_failed_mode():
    round_ = {"wall_s": 2.5, "median_ms": 4.2, "p90_ms": 5.0, "stall_s": 0.1, "cpu_s": 2.4, "gc_s": 0.3,
              "gc_full": 2, "steps": 513, "cpu_probe_ms": 21.0}
    result = {"mode": "inprocess", "engine_kwargs": {}, "import_vllm_s": 9.0, "engine_start_s": 41.0,
              "triton_cache": "RLCONF_TRITON_SHARED_CACHE=0",
              "startup": [{"name": "vllm.utils.jit_monitor.activate", "at_s": 40.0, "seconds": 0.01}],
              "not_timed": ["x.y"], "rounds": {"alone": [round_, {**round_, "wall_s": 3.5}]}}
    # asyncllm's rounds: wall times only (its engine steps in a process of its own)
    walls_only = {**round_, **{key: None for key in ("median_ms", "p90_ms", "stall_s", "cpu_s", "gc_s", "gc_full",
                                                     "steps")}, "wall_s": 2.1, "tokens": 32768}
    asyncllm = {**result, "mode": "asyncllm", "startup": [], "not_timed": [], "rounds": {"alone": [walls_only]}}
    text = alone.table([result, {"mode": "subprocess", "error": "Traceback ... CUDA error"}, asyncllm])
    assert "AsyncLLM(...) 41.0 s" in text and "  alone          2.100         -       -" in text
    assert "vllm.LLM(...) 41.0 s; Triton cache: RLCONF_TRITON_SHARED_CACHE=0" in text and "vllm.utils.jit_monitor.activate" in text and "not timed: x.y" in text
    assert "median 3.000 s, min 2.500, max 3.500" in text and "subprocess: FAILED" in text and "CUDA error" in text


def test_a_start_cut_off_by_the_timeout_is_told_apart_from_a_failure(tmp_path, monkeypatch, capsys):
    def cut_off(command, **kwargs):
        raise subprocess.TimeoutExpired(command, kwargs["timeout"], output=b"Capturing CUDA graphs", stderr=None)

    monkeypatch.setattr(alone.subprocess, "run", cut_off)
    monkeypatch.setattr(sys, "argv", ["vllm_alone.py", "--modes", "inprocess", "--timeout-s", "7", "--out",
                                      str(tmp_path)])
    alone.main()
    printed = capsys.readouterr().out
    assert "inprocess: TIMED OUT after 7 s" in printed and "FAILED" not in printed
    assert "Capturing CUDA graphs" in (tmp_path / "vllm_alone_0_inprocess.log").read_text()


@pytest.mark.slow
def test_the_driver_steps_run_on_a_cpu_machine():
    done = subprocess.run([sys.executable, str(BENCH / "vllm_alone.py"), "--driver"], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    for piece in ("compile the plan", "local_gpu (nvidia-smi)", "import engine.trainer", "torch.cuda.device_count"):
        assert piece in done.stdout


def test_a_profiled_function_reports_its_first_call_once_and_still_answers():
    import json

    into: dict[str, str] = {}
    assert alone.profile_function("json.dumps", into)
    try:
        assert json.dumps({"a": 1}) == '{"a": 1}' and json.dumps([2]) == "[2]"
        assert list(into) == ["dumps"] and "Triton cache before:" in into["dumps"] and "cumulative" in into["dumps"]
        assert into["dumps"].startswith("call 1 of json.dumps: ")
    finally:
        json.dumps = json.dumps.__wrapped__  # the module's own function back for every later test
    assert not alone.profile_function("no_such_module_here.f", into)
    assert not alone.profile_function("json.no_such_function", into)


def test_a_method_is_profiled_on_the_call_asked_for():
    import fractions

    into: dict[str, str] = {}
    original = fractions.Fraction.limit_denominator
    assert alone.profile_function("fractions.Fraction.limit_denominator@3", into)
    try:
        half = fractions.Fraction(1, 2)
        assert half.limit_denominator(10) == half and half.limit_denominator(10) == half and into == {}
        assert half.limit_denominator(10) == half  # the third call: profiled
        assert into["limit_denominator"].startswith("call 3 of fractions.Fraction.limit_denominator: ")
        half.limit_denominator(10)
        assert into["limit_denominator"].startswith("call 3 ")  # once
    finally:
        fractions.Fraction.limit_denominator = original


def test_an_executor_of_vllms_own_processes_is_not_run_in_process(tmp_path, monkeypatch, capsys):
    started = []
    monkeypatch.setattr(alone.subprocess, "run", lambda command, **kwargs: started.append(command) or
                        subprocess.CompletedProcess(command, 1, "", "no GPU here"))
    monkeypatch.setattr(sys, "argv", ["vllm_alone.py", "--modes", "inprocess,asyncllm", "--out", str(tmp_path),
                                      "--engine-kwargs", '{"distributed_executor_backend": "mp"}'])
    alone.main()
    printed = capsys.readouterr().out
    assert "inprocess (engine kwargs {'distributed_executor_backend': 'mp'}): not run" in printed
    assert [command[command.index("--child") + 1] for command in started] == ["asyncllm"]
    assert alone.not_runnable("inprocess", {"distributed_executor_backend": "external_launcher"}) is None


@pytest.mark.slow
def test_mode_ray_runs_the_child_in_a_ray_actor_process_of_its_own():
    pytest.importorskip("ray")
    import os

    # a lambda travels by value (this test module is not importable in Ray's worker)
    out = alone.in_ray_actor(lambda tag: {"tag": tag, "pid": __import__("os").getpid()}, "x", num_gpus=0)
    assert out["tag"] == "x" and out["pid"] != os.getpid()


def test_cpus_pin_the_engines_thread_and_leave_vllms_arguments():
    allowed = os.sched_getaffinity(0)
    kwargs = {"async_scheduling": True, "_cpus": [min(allowed)]}
    try:
        assert alone.pin_cpus(kwargs) == [min(allowed)] and kwargs == {"async_scheduling": True}
        assert os.sched_getaffinity(0) == {min(allowed)}
    finally:
        os.sched_setaffinity(0, allowed)
    assert alone.pin_cpus({"async_scheduling": True}) == sorted(allowed)  # no "_cpus": untouched
    assert alone.cpus_text([2]) == "; CPUs 2" and alone.cpus_text(list(range(32))) == "; 32 CPUs"
