"""bench/scaling.py's report on the CPU, from made-up launches: the quartile range of the ratios, the engine's
figures and the estimate ÷ peak per configuration, and with --rounds the order of the launches, the pool of their
steady steps, each round's own ratio and scaling.json after every launch (the launches themselves need GPUs)."""

from __future__ import annotations

import json
import sys

import pytest
from bench_scripts import bench_module

torch = pytest.importorskip("torch")
scaling = bench_module("scaling")

ESTIMATE = {"training": 10.5, "rollout": 10.1}  # GiB, the plan's; the made-up peaks are 10 GiB


def step_lines(steady_seconds: list[float], peak_gb: float = 10.0) -> list[dict]:
    """A launch's metrics.jsonl steps: a slow first step (compiles, CUDA graphs), then the steady ones."""
    return [{"step": number, "timing/step": seconds, "timing/generate": 2.0, "timing/update_actor": 0.5,
             "timing/weight_sync": 0.1, "timing/rollout_engine_step_median": 0.0045, "timing/rollout_engine_gc": 0.25,
             "memory/actor_peak_gb": peak_gb, "memory/rollout_peak_gb": 10.0, "actor/ppo_kl": 0.1 * number}
            for number, seconds in enumerate([30.0, *steady_seconds], 1)]


def launch(name: str, steady_seconds: list[float], strong: bool = False, peak_gb: float = 10.0):
    shape = scaling.config_shape(name, strong)
    lines = step_lines(steady_seconds, peak_gb)
    return scaling.Round(scaling.round_record(shape, lines, [], ESTIMATE, 90.0, False), lines)


def failed(error: str = "timed out"):
    return scaling.Round({"error": error, "steps": 0})


def fake_run_config(steady_by_launch: dict[str, list[float] | Exception], calls: list[tuple[str, dict | None]]):
    """run_config that answers each launch (by its log's name) from `steady_by_launch`, and notes the launch with
    what scaling.json held when it started."""

    def run_config(name, model, steps, strong, extra, timeout, log_path):
        written = log_path.parent / "scaling.json"
        calls.append((log_path.name, json.loads(written.read_text()) if written.is_file() else None))
        answer = steady_by_launch[log_path.name]
        if isinstance(answer, Exception):
            raise answer
        return launch(name, answer, strong)

    return run_config


def run_main(monkeypatch, tmp_path, argv, run_config):
    monkeypatch.setattr(scaling, "run_config", run_config)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "a made-up GPU")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("OUT", str(tmp_path))
    monkeypatch.setattr(sys, "argv", ["scaling.py", *argv])
    scaling.main()
    return json.loads((tmp_path / "scaling.json").read_text())


def test_the_report_gives_each_ratio_with_the_range_its_quartiles_allow(monkeypatch, capsys, tmp_path):
    steady = {"scaling_1gpu.log": [2.7, 3.0, 3.2], "scaling_2gpu_tp1.log": [3.5, 3.8, 4.0]}
    results = run_main(monkeypatch, tmp_path, ["--configs", "1gpu,2gpu_tp1"], fake_run_config(steady, []))
    out = capsys.readouterr().out
    # 16 prompts in 3.8 s against 8 in 3.0 s: 1.58; from 2 GPUs slow (4.0 s) and 1 fast (2.7 s) up to the reverse.
    assert "2gpu_tp1 / 1gpu completion tokens/s: 1.58 (quartile range 1.35–1.83)\n" in out
    assert "(2.70–3.20)" in out and "gc s 0.25" in out and "training 1.050  rollout 1.010" in out
    assert "by round" not in out  # one round: the report as before --rounds
    assert [len(results[name]["rounds"]) for name in ("1gpu", "2gpu_tp1")] == [1, 1]


def test_rounds_reverse_the_order_every_other_round_so_each_configuration_goes_first_as_often():
    assert scaling.run_order(["1gpu", "2gpu_tp1"], 1) == [(1, "1gpu"), (1, "2gpu_tp1")]
    assert scaling.run_order(["1gpu", "2gpu_tp1", "2gpu_tp2"], 3) == [
        (1, "1gpu"), (1, "2gpu_tp1"), (1, "2gpu_tp2"), (2, "2gpu_tp2"), (2, "2gpu_tp1"), (2, "1gpu"),
        (3, "1gpu"), (3, "2gpu_tp1"), (3, "2gpu_tp2")]


def test_a_configuration_pools_the_steady_steps_of_all_its_rounds_not_their_medians():
    shape = scaling.config_shape("1gpu", strong=False)
    pooled = scaling.pooled_record(shape, [launch("1gpu", [2.0, 2.1, 2.2, 2.3]), failed(),
                                           launch("1gpu", [3.0], peak_gb=12.0)])
    # Five steady steps (each launch's first step left out, the failed launch has none): their median is 2.2 s;
    # the two rounds' medians (2.15, 3.0) would make 2.575.
    assert pooled["step_s"] == pytest.approx(2.2)
    assert pooled["step_s_quartiles"] == pytest.approx([2.05, 2.65])
    assert pooled["completion_tokens_per_s"] == pytest.approx(8 * 8 * 512 / 2.2)
    # The peak is the highest over every pooled step, and the estimate ÷ peak is taken against it.
    assert pooled["peak_gib"]["training"] == 12.0
    assert pooled["estimate_over_peak"]["training"] == pytest.approx(10.5 / 12.0)
    assert pooled["pooled_rounds"] == [1, 3]
    assert [r.get("error") for r in pooled["rounds"]] == [None, "timed out", None]
    assert pooled["rounds"][0]["step_s"] == pytest.approx(2.15) and pooled["rounds"][2]["step_s"] == 3.0


def test_one_round_pools_to_that_rounds_own_figures():
    shape = scaling.config_shape("2gpu_tp1", strong=False)
    one = launch("2gpu_tp1", [3.5, 3.8, 4.0])
    pooled = scaling.pooled_record(shape, [one])
    for key in ("step_s", "step_s_quartiles", "completion_tokens_per_s", "medians", "estimate_over_peak"):
        assert pooled[key] == one.record[key]


def test_a_configuration_whose_every_round_failed_says_what_each_round_died_of():
    shape = scaling.config_shape("2gpu_tp2", strong=False)
    assert scaling.pooled_record(shape, [failed()])["error"] == "timed out"
    assert (scaling.pooled_record(shape, [failed(), failed("exit 1")])["error"]
            == "round 1: timed out; round 2: exit 1")


def test_each_rounds_ratio_pairs_the_two_launches_of_that_round():
    shape_one, shape_two = scaling.config_shape("1gpu", False), scaling.config_shape("2gpu_tp1", False)
    one = scaling.pooled_record(shape_one, [launch("1gpu", [2.0]), launch("1gpu", [3.0]), launch("1gpu", [2.0])])
    two = scaling.pooled_record(shape_two, [launch("2gpu_tp1", [3.0]), launch("2gpu_tp1", [3.6]), failed()])
    ratios = scaling.round_ratios(one, two)
    # Round 1: 16 prompts in 3.0 s against 8 in 2.0 s; round 2: in 3.6 s against 3.0 s; round 3's 2-GPU launch failed.
    assert ratios[0] == pytest.approx(4 / 3) and ratios[1] == pytest.approx(5 / 3) and ratios[2] is None


def test_rounds_run_interleaved_and_print_the_pooled_ratio_with_each_rounds_own(monkeypatch, capsys, tmp_path):
    steady = {"scaling_1gpu_round1.log": [2.0, 2.0, 2.0], "scaling_2gpu_tp1_round1.log": [3.0, 3.0, 3.0],
              "scaling_2gpu_tp1_round2.log": [3.6, 3.6, 3.6], "scaling_1gpu_round2.log": [3.0, 3.0, 3.0]}
    calls: list = []
    results = run_main(monkeypatch, tmp_path, ["--configs", "1gpu,2gpu_tp1", "--rounds", "2"],
                       fake_run_config(steady, calls))
    out = capsys.readouterr().out
    assert [log for log, _ in calls] == list(steady)  # A, B, then B, A
    # Pooled: 1 GPU 2.5 s (2.0–3.0), 2 GPUs 3.3 s (3.0–3.6): (16 / 3.3) / (8 / 2.5) = 1.52; by round 1.33, 1.67.
    assert "2gpu_tp1 / 1gpu completion tokens/s: 1.52 (quartile range 1.11–2.00), by round 1.33 1.67\n" in out
    assert results["1gpu"]["step_s"] == 2.5 and results["rounds"] == 2
    assert [r["step_s"] for r in results["1gpu"]["rounds"]] == [2.0, 3.0]  # in round order, though run last
    assert results["device"] == "a made-up GPU"
    # the printed ratios are kept in the file too (a call cut short after the launches keeps them)
    kept = results["ratios"]["2gpu_tp1 / 1gpu"]
    assert round(kept["ratio"], 2) == 1.52 and [round(r, 2) for r in kept["by_round"]] == [1.33, 1.67]
    assert round(kept["low"], 2) == 1.11 and round(kept["high"], 2) == 2.0 and list(results["ratios"]) == ["2gpu_tp1 / 1gpu"]


def test_scaling_json_is_written_after_every_launch_and_a_failed_launch_keeps_the_other_rounds(
        monkeypatch, capsys, tmp_path):
    steady = {"scaling_1gpu_round1.log": [2.0, 2.0], "scaling_2gpu_tp1_round1.log": [3.0, 3.0],
              "scaling_2gpu_tp1_round2.log": RuntimeError("Ray lost a worker"), "scaling_1gpu_round2.log": [3.0, 3.0],
              "scaling_1gpu_round3.log": [2.0, 2.0], "scaling_2gpu_tp1_round3.log": [3.6, 3.6]}
    calls: list = []
    results = run_main(monkeypatch, tmp_path, ["--configs", "1gpu,2gpu_tp1", "--rounds", "3"],
                       fake_run_config(steady, calls))
    out = capsys.readouterr().out
    # What each launch found on disk: nothing before the first, then every launch before it.
    assert calls[0][1] is None
    assert [len(calls[2][1][name]["rounds"]) for name in ("1gpu", "2gpu_tp1")] == [1, 1]
    assert "Ray lost a worker" in calls[3][1]["2gpu_tp1"]["rounds"][1]["error"]
    assert results["2gpu_tp1"]["pooled_rounds"] == [1, 3] and results["1gpu"]["pooled_rounds"] == [1, 2, 3]
    assert ", by round 1.33 - 1.11\n" in out and "2gpu_tp1       round 2  failed: RuntimeError: Ray lost a worker" in out


def test_an_unknown_configuration_is_refused_before_any_launch(monkeypatch, capsys, tmp_path):
    with pytest.raises(SystemExit):
        run_main(monkeypatch, tmp_path, ["--configs", "1gpu,2gpu"], fake_run_config({}, []))
    assert "unknown configuration(s) 2gpu; known: 1gpu, 2gpu_tp1" in capsys.readouterr().err


def test_a_launch_gets_what_the_budget_leaves_and_none_starts_with_too_little():
    assert scaling.launch_limit(140, None, 500) == 140  # no budget: --run-timeout-s
    assert scaling.launch_limit(140, 400, 100) == 140  # 285 s left after the teardown's 15
    assert scaling.launch_limit(140, 400, 300) == 85  # 85 s left: the launch is cut to it
    assert scaling.launch_limit(140, 400, 330) is None  # 55 s: under a minute, not started


def test_a_launch_the_budget_cannot_hold_is_skipped_and_said_so(monkeypatch, capsys, tmp_path):
    clock = iter([0.0, 0.0, 200.0, 380.0, 390.0, 400.0])  # began, then before each launch
    monkeypatch.setattr(scaling.time, "perf_counter", lambda: next(clock))
    steady = {"scaling_1gpu.log": [2.0, 2.0], "scaling_2gpu_tp1.log": [3.0, 3.0]}
    limits: list[float] = []

    def run_config(name, model, steps, strong, extra, timeout, log_path):
        limits.append(timeout)
        return launch(name, steady[log_path.name], strong)

    results = run_main(monkeypatch, tmp_path, ["--configs", "1gpu,2gpu_tp1,2gpu_tp2", "--budget-s", "420",
                                               "--run-timeout-s", "150"], run_config)
    assert limits == [150, 150]  # 405 and 205 s left: the whole limit each
    assert "not launched" in results["2gpu_tp2"]["error"] and "420" in results["2gpu_tp2"]["error"]
    assert "2gpu_tp1 / 1gpu" in results["ratios"]


@pytest.mark.parametrize("name, base", [("1gpu_mp", "1gpu"), ("2gpu_tp1_mp", "2gpu_tp1")])
def test_the_mp_configurations_are_their_in_process_twins_with_vllm_in_processes_of_its_own(name, base):
    from rlconf.compile import compile_plan
    from grpo_vs_trl import plan_overrides

    mp_overrides = scaling.config_overrides(name, **scaling.config_shape(name, False))
    assert mp_overrides == scaling.config_overrides(base, **scaling.config_shape(base, False)) + scaling.MP
    result = compile_plan(scaling.ROOT / "presets" / "quickstart.yaml",
                          plan_overrides("random://Qwen2.5-0.5B", 3) + mp_overrides)
    assert result.resolved is not None and not result.errors, [d.message for d in result.errors]
    assert (base, name) in scaling.RATIO_PAIRS
