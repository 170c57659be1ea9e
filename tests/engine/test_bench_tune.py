"""bench/tune.py and bench/tune_costs.py on CPU: the plans they build for the GPUs (the same training in every
variant, each one launchable), what they read from metrics.jsonl, and the profile they fit. The launches
themselves: test_bench_tune_runs_every_variant_on_cpu (slow)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

import tune as bench_tune  # noqa: E402
import tune_costs as bench_costs  # noqa: E402

from rlconf.compile import compile_plan  # noqa: E402
from rlconf.tune_costs import load_costs, write_profile  # noqa: E402


def training(config) -> dict:
    arr = config.actor_rollout_ref
    return {"batch": config.data.train_batch_size, "n": arr.rollout.n, "mini": arr.actor.ppo_mini_batch_size,
            "lengths": (config.data.max_prompt_length, config.data.max_response_length), "model": arr.model.path,
            "gpus": config.trainer.n_gpus_per_node, "lr": arr.actor.optim.lr, "tp": arr.rollout.tensor_model_parallel_size}


@pytest.mark.parametrize("name", ["0.5b_1gpu", "3b_2gpu"])
def test_the_three_plans_of_a_gpu_config_are_the_same_training_with_other_knobs(tmp_path, name):
    plans = bench_tune.build_plans(name, bench_tune.CONFIGS[name], 79.6, tmp_path, bench_tune.ALL_VARIANTS)
    assert [p.variant for p in plans] == ["untuned", "tuned", "hand", "hand_verl", "tuned_awake", "tuned_mp"]
    mp_plan = plans.pop()  # the tuned plan with vLLM in processes of its own: the same training
    assert mp_plan.ok, mp_plan.problem
    mp = compile_plan(mp_plan.path, bench_tune.COMMON).config
    assert mp.actor_rollout_ref.rollout.engine_kwargs.vllm["distributed_executor_backend"] == "mp"
    assert training(mp) == training(compile_plan(plans[1].path, bench_tune.COMMON).config)
    awake_plan = plans.pop()  # launched only where vLLM's share fits beside the tuned training phase (next test)
    assert awake_plan.ok or "do not fit this size" in awake_plan.problem
    assert all(p.ok for p in plans), [p.problem for p in plans]
    # Both hand plans fit the GPU by the estimate with the tuner's margin (_check refuses them otherwise).
    assert all(max(p.estimate_gib.values()) * 1.15 <= 79.6 for p in plans[2:])
    compiled = {p.variant: compile_plan(p.path, bench_tune.COMMON) for p in plans}
    assert {v: training(c.config) for v, c in compiled.items()} == {v: training(compiled["untuned"].config)
                                                                     for v in compiled}
    untuned = compiled["untuned"].config.actor_rollout_ref
    assert untuned.actor.ppo_micro_batch_size_per_gpu == 4 and not untuned.actor.use_dynamic_bsz  # verl's defaults
    assert untuned.rollout.gpu_memory_utilization == 0.5
    tuned = compiled["tuned"]
    assert tuned.errors == [] and tuned.warnings == []
    # The tuner saw the launches' overrides: the estimate it fitted is the one of the plan as launched.
    assert max(plans[1].estimate_gib.values()) * 1.15 <= 79.6


def test_tuned_awake_is_the_tuned_plan_with_vllm_kept_awake_where_its_share_fits_beside_training(tmp_path):
    """7B on two H200s: the tuned plan's knobs, free_cache_engine false, and vLLM's share counted in the training
    phase's estimate (which still fits with the tuner's margin, so it launches)."""
    tuned, awake = bench_tune.build_plans("7b_2gpu", bench_tune.CONFIGS["7b_2gpu"], 140.4, tmp_path,
                                          ("tuned", "tuned_awake"))
    assert tuned.ok and awake.ok, (tuned.problem, awake.problem)
    assert awake.knobs == [bench_tune.AWAKE] and "base: tuned.yaml" in awake.path.read_text()
    compiled = {p.variant: compile_plan(p.path, bench_tune.COMMON) for p in (tuned, awake)}
    assert training(compiled["tuned"].config) == training(compiled["tuned_awake"].config)
    assert not compiled["tuned_awake"].config.actor_rollout_ref.rollout.free_cache_engine
    training_gib = {v: max(g for k, g in p.estimate_gib.items() if k.endswith("/training")) for v, p in
                    (("tuned", tuned), ("tuned_awake", awake))}
    assert training_gib["tuned_awake"] > training_gib["tuned"] + 30  # vLLM's share (0.3 of 140 GiB) kept
    assert max(awake.estimate_gib.values()) * 1.15 <= 140.4


def test_seven_b_on_one_gpu_gets_the_tuners_no_fit_answer_and_is_not_launched(tmp_path):
    plans = bench_tune.build_plans("7b_1gpu", bench_tune.CONFIGS["7b_1gpu"], 79.6, tmp_path, ("tuned",))
    assert not plans[0].ok and "no fit" in plans[0].problem and "more GPUs" in plans[0].problem


def test_a_hand_plan_the_estimate_says_does_not_fit_is_not_launched_and_the_untuned_one_is(tmp_path):
    plans = bench_tune.build_plans("7b_1gpu", bench_tune.CONFIGS["7b_1gpu"], 79.6, tmp_path, ("untuned", "hand"))
    untuned, hand = plans
    assert untuned.ok  # verl's defaults launch whatever they estimate: the table says what happened
    assert not hand.ok and "over the GPU's 79.6 GiB" in hand.problem
    # On an H200 verl's offloading example fits with the margin; the fastest row's knobs (no offload) still do not.
    hand, verl = bench_tune.build_plans("7b_1gpu", bench_tune.CONFIGS["7b_1gpu"], 139.8, tmp_path / "h200",
                                        ("hand", "hand_verl"))
    assert verl.ok and not hand.ok


def test_dry_run_builds_every_config_and_launches_nothing(tmp_path, capsys):
    code = bench_tune.main(["--dry-run", "--gpu-memory", "79.6", "--out", str(tmp_path)])
    printed = capsys.readouterr().out
    assert code == 1  # 7b_1gpu's tuned plan has no fit: said, not launched
    assert printed.count("python -m rlconf launch") == 3 * len(bench_tune.CONFIGS)
    assert "nothing launched" in printed and not (tmp_path / "runs" / "0.5b_1gpu__tuned.json").exists()


def record(step: int, **extra) -> dict:
    return {"step": step, "timing/step": 10.0 if step == 1 else 2.0 + step / 10, "response_length/mean": 512.0,
            "perf/tokens": 67584, "timing/update_actor": 1.0, "timing/old_log_prob": 0.5, "timing/generate": 1.2,
            "memory/actor_peak_gb": 30.0 + step, "memory/rollout_peak_gb": 29.0, **extra}


def test_measure_takes_the_median_after_step_one_and_the_largest_peaks():
    records = [record(1, **{"timing/startup_total": 70.0}), record(2), record(3), record(4)]
    out = bench_tune.measure(records)
    assert out["steady_step_s"] == 2.3 and out["startup_total_s"] == 70.0
    assert out["actor_peak_gb"] == 34.0 and out["rollout_peak_gb"] == 29.0
    assert out["stage_medians_s"]["update_actor"] == 1.0
    assert [row["step"] for row in out["stages_by_step"]] == [1, 2, 3, 4]  # step 1 too: the median leaves it out
    assert out["stages_by_step"][1]["seconds"] == {"generate": 1.2, "old_log_prob": 0.5, "step": 2.2,
                                                   "update_actor": 1.0}
    assert "startup_total" not in out["stages_by_step"][0]["seconds"]
    alone = bench_tune.measure([record(1)])  # step 1 pays for compiles: no step time to compare
    assert "steady_step_s" not in alone and alone["actor_peak_gb"] == 31.0
    row = bench_tune.finish({**alone, "steps_done": 1, "exit": -9}, bench_tune.Plan("c", "hand", Path("p"), ""),
                            bench_tune.CONFIGS["3b_1gpu"])
    assert "completion_tokens_per_s" not in row


def test_the_table_gives_tuned_over_untuned_and_over_hand(tmp_path):
    runs = [{"config": "c", "variant": "untuned", "completion_tokens_per_s": 100.0, "steady_step_s": 4.0},
            {"config": "c", "variant": "tuned", "completion_tokens_per_s": 150.0, "steady_step_s": 2.0},
            {"config": "c", "variant": "hand", "oom": True, "exit": 1}]
    text = bench_tune.table(runs)
    assert "| c | untuned | ran |" in text and text.splitlines()[2].endswith("| 1.50 |")
    assert "| c | hand | out of memory |" in text


def test_rounds_of_a_plan_make_one_row_with_their_median():
    runs = [{"config": "c", "variant": "untuned", "completion_tokens_per_s": 100.0, "steady_step_s": 4.0, "round": 1},
            {"config": "c", "variant": "tuned", "completion_tokens_per_s": 150.0, "steady_step_s": 2.0, "round": 1,
             "actor_peak_gb": 10.0, "estimate_training_gib": 11.0},
            {"config": "c", "variant": "untuned", "completion_tokens_per_s": 80.0, "steady_step_s": 5.0, "round": 2},
            {"config": "c", "variant": "tuned", "completion_tokens_per_s": 160.0, "steady_step_s": 1.9, "round": 2,
             "actor_peak_gb": 11.0, "estimate_training_gib": 11.0},
            {"config": "c", "variant": "untuned", "skipped": "budget", "round": 3}]
    rows = bench_tune.table(runs).splitlines()
    # untuned: the two rounds that ran (a skipped third says nothing); tuned ÷ untuned = median 155 ÷ median 90
    # tuned ÷ untuned: the median of the rounds' ratios, 150 ÷ 100 and 160 ÷ 80
    assert rows[2].startswith("| c | untuned | ran ×2: 4.00, 5.00 | 4.50 | 90 |") and rows[2].endswith("| 1.75 (2 rounds) |")
    assert "| c | tuned | ran ×2: 2.00, 1.90 | 1.95 | 155 |" in rows[3]
    assert "| 11.00 / – | 1.00 / – |" in rows[3]  # the larger peak of the two rounds against the estimate
    # A round one side missed says nothing: hand ran only in round 1, where both ran at 100 tok/s.
    runs = [{"config": "c", "variant": "tuned", "completion_tokens_per_s": 100.0, "steady_step_s": 2.0, "round": 1},
            {"config": "c", "variant": "hand", "completion_tokens_per_s": 100.0, "steady_step_s": 2.0, "round": 1},
            {"config": "c", "variant": "tuned", "completion_tokens_per_s": 200.0, "steady_step_s": 1.0, "round": 2},
            {"config": "c", "variant": "hand", "skipped": "budget", "round": 2}]
    assert bench_tune.table(runs).splitlines()[3].endswith("| 1.00 |")


def test_fitted_points_make_a_profile_the_tuner_reads(tmp_path):
    points = {"command": "bench/tune_costs.py", "device": "cpu", "model": "Qwen2.5-0.5B", "num_params_b": 0.49,
              "date": "2000-01-01", "commit": None, "workload": {},
              "points": [{"point": "budget_2", "utilization": 0.5, "training_s_per_ktoken": 0.04,
                          "generate_s_per_ktoken": 0.03},
                         {"point": "budget_8", "utilization": 0.5, "training_s_per_ktoken": 0.02,
                          "generate_s_per_ktoken": 0.05, "knobs": [bench_costs.ASYNC_OFF]},
                         {"point": "nockpt_8", "utilization": 0.5, "training_s_per_ktoken": 0.015},
                         {"point": "compile_8", "utilization": 0.5, "training_s_per_ktoken": 0.018,
                          "generate_s_per_ktoken": 0.05},
                         {"point": "async_8", "utilization": 0.5, "training_s_per_ktoken": 0.02,
                          "generate_s_per_ktoken": 0.04},
                         {"point": "util_0.7", "utilization": 0.7, "training_s_per_ktoken": 0.02,
                          "generate_s_per_ktoken": 0.035},
                         {"point": "chunk_8", "skipped": "budget"}]}
    path = tmp_path / "points.json"
    path.write_text(json.dumps(points))
    profile = bench_costs.fit([path])
    terms = profile["terms"]
    assert terms["training_s_per_ktoken"] == [[2.0, 0.04], [8.0, 0.02]]
    assert terms["generate_s_per_ktoken"] == [[0.5, 0.04], [0.7, 0.035]]  # the two budget runs' median at 0.5
    assert terms["checkpointing_off_factor"] == 0.75 and "entropy_chunking_factor" not in terms
    # compile_8 against budget_8's training; async_8 against budget_8's generation, kept out of the curve
    assert terms["compile_layers_factor"] == 0.9 and terms["async_scheduling_factor"] == 0.8
    # budget_8 with async scheduling left unset ran with it on (vLLM 0.25's default): on against on, no factor
    points["points"][1]["knobs"] = []
    path.write_text(json.dumps(points))
    assert "async_scheduling_factor" not in bench_costs.fit([path])["terms"]
    points["points"][1]["knobs"] = [bench_costs.ASYNC_OFF]
    path.write_text(json.dumps(points))
    # Launches of the same knobs: training at budget 8 (budget_8, async_8, util_0.7) all 0.02; generation at
    # 0.5 without async (budget_2, budget_8, compile_8): 0.03, 0.05, 0.05, so (0.05 − 0.03) ÷ 0.05
    assert terms["training_spread"] == 0.0 and terms["generate_spread"] == 0.4
    costs = tmp_path / "costs.json"
    write_profile(profile, costs)
    assert load_costs(costs).profiles[0].factor("checkpointing_off_factor") == 0.75
    assert load_costs(costs).profiles[0].factor("async_scheduling_factor") == 0.8


def test_in_process_points_give_the_training_terms_and_launches_the_generation_ones(tmp_path):
    common = {"device": "cpu", "model": "Qwen2.5-0.5B", "date": "2000-01-01", "commit": None, "workload": {}}
    launches = {**common, "command": "bench/tune_costs.py", "num_params_b": 0.49, "points": [
        {"point": "budget_8", "utilization": 0.5, "training_s_per_ktoken": 0.09, "generate_s_per_ktoken": 0.05},
        {"point": "compile_8", "utilization": 0.5, "training_s_per_ktoken": 0.08, "generate_s_per_ktoken": 0.05},
        {"point": "util_0.7", "utilization": 0.7, "training_s_per_ktoken": 0.06, "generate_s_per_ktoken": 0.04}]}
    in_process = {**common, "command": "bench/tune_training_costs.py", "measured": "in_process", "num_params_b": 0.49,
                  "points": [{"point": "budget_8", "training_s_per_ktoken": 0.02, "training_rounds": [0.02, 0.021, 0.02]},
                             {"point": "compile_8", "training_s_per_ktoken": 0.015,
                              "training_rounds": [0.015, 0.015, 0.0153]}]}
    files = []
    for name, call in (("launches", launches), ("in_process", in_process)):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(call))
    terms = bench_costs.fit(files)["terms"]
    assert terms["training_s_per_ktoken"] == [[8.0, 0.02]]  # the launches' 0.09 is left out
    # the median of the per-round ratios 0.75, 0.714, 0.765; the launches said 0.89
    assert terms["compile_layers_factor"] == 0.75
    assert terms["training_spread"] == 0.04  # those ratios: 2 × median |r − 0.75| (0.015) ÷ 0.75
    assert terms["generate_s_per_ktoken"] == [[0.5, 0.05], [0.7, 0.04]] and terms["generate_spread"] == 0.0
    costs = tmp_path / "costs.json"
    bench_costs.main(["--fit", *map(str, files), "--write", str(costs), "--out", str(tmp_path)])
    before = costs.read_text()
    with pytest.raises(SystemExit):  # writing in-process terms alone would drop the profile's generation terms
        bench_costs.main(["--fit", str(files[1]), "--write", str(costs), "--out", str(tmp_path)])
    assert costs.read_text() == before
    # One round still compiling a shape (as compile_64's first on the H100): the paired ratios' spread ignores it
    # ((max − min) ÷ max of the rounds made it 0.7, which hid every factor), and the factor is the other rounds'.
    slow_round = {**in_process, "points": [
        {"point": "budget_8", "training_s_per_ktoken": 0.02, "training_rounds": [0.02, 0.02, 0.02, 0.02]},
        {"point": "compile_8", "training_s_per_ktoken": 0.015, "training_rounds": [0.05, 0.015, 0.015, 0.016]}]}
    # ratios 2.5, 0.75, 0.75, 0.8: median 0.775, spread 2 × 0.025 ÷ 0.775
    assert bench_costs.paired_ratio(*slow_round["points"][::-1], "training_rounds") == 0.775
    assert bench_costs.spreads([slow_round], [])["training_spread"] == 0.0645
    assert bench_costs.ratio_spread([2.5, 0.1]) == 0.99  # bounded below 1, as the cost file requires
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**in_process, "model": "Qwen2.5-1.5B"}))
    with pytest.raises(SystemExit, match="more than one device or model"):
        bench_costs.fit([files[0], other])


def test_in_process_generation_points_give_the_generation_terms(tmp_path):
    common = {"device": "cpu", "model": "Qwen2.5-0.5B", "date": "2000-01-01", "commit": None, "workload": {},
              "measured": "in_process", "num_params_b": 0.49}
    training = {**common, "command": "bench/tune_training_costs.py", "points": [
        {"point": "budget_8", "training_s_per_ktoken": 0.02, "training_rounds": [0.02, 0.02]}]}
    generation = {**common, "command": "bench/tune_generate_costs.py", "terms": "generation", "points": [
        {"point": "util_0.3", "utilization": 0.3, "async_scheduling": False, "generate_s_per_ktoken": 0.04,
         "generate_rounds": [0.04, 0.041, 0.039], "knobs": [bench_costs.ASYNC_OFF]},
        {"point": "util_0.3+async", "utilization": 0.3, "async_scheduling": True, "generate_s_per_ktoken": 0.03,
         "generate_rounds": [0.03, 0.03, 0.03]},
        {"point": "util_0.7", "utilization": 0.7, "async_scheduling": False, "generate_s_per_ktoken": 0.04,
         "generate_rounds": [0.04, 0.05, 0.04], "knobs": [bench_costs.ASYNC_OFF]},
        {"point": "util_0.5+async", "utilization": 0.5, "async_scheduling": True, "error": "did not start"}]}
    launches = {**common, "measured": None, "command": "bench/tune_costs.py", "points": [
        {"point": "budget_8", "utilization": 0.5, "training_s_per_ktoken": 0.09, "generate_s_per_ktoken": 0.09},
        {"point": "async_8", "utilization": 0.5, "training_s_per_ktoken": 0.09, "generate_s_per_ktoken": 0.2}]}
    files = {}
    for name, call in (("training", training), ("generation", generation), ("launches", launches)):
        files[name] = tmp_path / f"{name}.json"
        files[name].write_text(json.dumps(call))
    terms = bench_costs.fit([files["training"], files["generation"], files["launches"]])["terms"]
    # the curve from the engines without async scheduling; its factor against the engine at the same utilization;
    # nothing of the launches' generation (their async_8 said 0.2 ÷ 0.09)
    assert terms["generate_s_per_ktoken"] == [[0.3, 0.04], [0.7, 0.04]]
    assert terms["async_scheduling_factor"] == 0.75
    unset = json.loads(files["generation"].read_text())  # the plain engines left it unset: on, as the async one
    unset["points"][0]["knobs"] = unset["points"][2]["knobs"] = []
    files["unset"] = tmp_path / "unset.json"
    files["unset"].write_text(json.dumps(unset))
    assert "async_scheduling_factor" not in bench_costs.fit([files["training"], files["unset"]])["terms"]
    with pytest.raises(SystemExit, match="async scheduling"):  # one curve of engines with it off and on
        bench_costs.fit([files["training"], files["generation"], files["unset"]])
    # paired with util_0.3's rounds (0.04, 0.041, 0.039): util_0.7's ratios 1, 1.2195, 1.0256, twice their median
    # deviation (0.0256) over their median (1.0256); the rounds' own (max − min) ÷ max would say 0.2
    assert terms["generate_spread"] == 0.05
    assert terms["training_s_per_ktoken"] == [[8.0, 0.02]]
    costs = tmp_path / "costs.json"
    failed = tmp_path / "failed.json"  # a generation call whose engines all failed: no generation terms either
    failed.write_text(json.dumps({**generation, "points": generation["points"][3:]}))
    files["failed"] = failed
    bench_costs.main(["--fit", str(files["training"]), str(files["generation"]), "--write", str(costs),
                      "--out", str(tmp_path)])
    assert load_costs(costs).profiles[0].factor("async_scheduling_factor") == 0.75
    before = costs.read_text()
    for alone in ("training", "generation", "failed"):  # one kind alone would drop the profile's other terms
        if alone == "failed":
            alone_args = [str(files["training"]), str(failed)]
        else:
            alone_args = [str(files[alone])]
        with pytest.raises(SystemExit):
            bench_costs.main(["--fit", *alone_args, "--write", str(costs), "--out", str(tmp_path)])
        assert costs.read_text() == before


def test_an_in_process_spread_compares_each_budget_with_the_largest_and_each_factor_with_its_budget():
    call = {"measured": "in_process", "points": [
        {"point": "budget_8", "training_rounds": [0.08, 0.08, 0.08, 0.08]},
        {"point": "budget_32", "training_rounds": [0.02, 0.03, 0.025, 0.02]},
        {"point": "nockpt_32", "training_rounds": [0.016, 0.024, 0.02, 0.016]}]}
    # nockpt_32 ÷ budget_32 is 0.8 every round; budget_8 ÷ budget_32 is 4, 2.67, 3.2, 4: median 3.6, deviations
    # 0.4, 0.93, 0.4, 0.4, so 2 × 0.4 ÷ 3.6
    assert bench_costs.spreads([call], [])["training_spread"] == 0.2222
    # a launch cut after step 1 gives no terms: step 1 pays for compiles
    assert bench_costs.measured({"stage_medians_s": {"update_actor": 40.0}, "tokens_median": 1000,
                                 "steady_steps": []}) == {}


@pytest.mark.slow
def test_in_process_generation_costs_run_the_engines_rollout_on_cpu(tmp_path):
    import subprocess

    # The pipeline a GPU run takes (one engine a child process, rounds interleaved), with the HF rollout.
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "tune_generate_costs.py"), "--device", "cpu",
                           "--rounds", "2", "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    record = json.loads((tmp_path / "points.json").read_text())
    assert record["terms"] == "generation" and [p["point"] for p in record["points"]] == ["util_0.3", "util_0.7"]
    for point in record["points"]:
        assert len(point["generate_rounds"]) == 2 and point["generate_s_per_ktoken"] > 0, point
    # its file goes through the fit (on CPU no utilization: no generation curve, and no crash)
    assert bench_costs.fit([tmp_path / "points.json"])["terms"]["generate_s_per_ktoken"] == []


@pytest.mark.slow
def test_in_process_training_costs_run_the_engines_workers_on_cpu(tmp_path):
    import subprocess

    # Its own process: the bench joins a one-rank process group, as a GPU run would. --park: each point's states
    # leave for host memory and come back around its passes (on a CPU run a move to where they are, but every
    # round's update must find its optimizer's moments where it left them).
    proc = subprocess.run([sys.executable, str(ROOT / "bench" / "tune_training_costs.py"), "--device", "cpu",
                           "--points", "budget_2,nockpt_2", "--rounds", "2", "--park", "--out", str(tmp_path)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    record = json.loads((tmp_path / "points.json").read_text())
    assert record["measured"] == "in_process" and record["workload"]["parked"]
    assert [p["point"] for p in record["points"]] == ["budget_2", "nockpt_2"]
    for point in record["points"]:
        assert "error" not in point and len(point["training_rounds"]) == 2
        assert point["training_s_per_ktoken"] > 0 and all(t > 0 for t in point["update_rounds"])


@pytest.mark.slow
def test_bench_tune_launches_the_tuned_plan_on_cpu(tmp_path):
    """The whole pipeline for one variant: plans, `rlconf tune --write`, a launch of 2 steps, the JSON and the
    table (the other variants' plans are built by the dry-run test; the ratios are checked on made-up records)."""
    assert bench_tune.main(["--device", "cpu", "--steps", "2", "--variants", "tuned", "--out", str(tmp_path)]) == 0
    report = json.loads((tmp_path / "tune.json").read_text())
    assert [r["variant"] for r in report["runs"]] == ["tuned"]
    assert list(report["model_builds_s"]) == ["tiny://qwen2"]  # built before the launch's time limit starts
    for run in report["runs"]:
        assert run["steps_done"] == 2 and not run["oom"] and run["completion_tokens_per_s"] > 0
        assert (tmp_path / "runs" / f"tiny_cpu__{run['variant']}.json").is_file()
    assert "| tiny_cpu | tuned | ran |" in (tmp_path / "tune.md").read_text()


def test_the_shipped_profile_is_the_fit_of_the_points_kept_in_bench_results():
    kept = ROOT / "bench" / "results" / "2026-11-27_tune_h100_inprocess"
    fitted = bench_costs.fit([kept / "training_points.json", kept / "generate_points.json"])
    (shipped,) = [p for p in json.loads((ROOT / "rlconf" / "tune_costs.json").read_text())["profiles"]
                  if (p["device"], p["model"]) == (fitted["device"], fitted["model"])]
    assert shipped["terms"] == fitted["terms"] and shipped["commit"] == fitted["commit"] == "b43d22b"


def test_the_shipped_1_5b_profile_is_the_fit_of_its_training_points():
    kept = ROOT / "bench" / "results" / "2026-11-28_tune_profile_1.5b"
    fitted = bench_costs.fit([kept / "points.json"])
    (shipped,) = [p for p in json.loads((ROOT / "rlconf" / "tune_costs.json").read_text())["profiles"]
                  if (p["device"], p["model"]) == (fitted["device"], fitted["model"])]
    assert fitted["model"] == "Qwen2.5-1.5B" and shipped["terms"] == fitted["terms"]
    assert not shipped["terms"]["generate_s_per_ktoken"]  # no generation points ran at 1.5B


def test_writing_a_fit_of_one_kind_refuses_only_where_it_would_lose_the_other(tmp_path):
    costs = tmp_path / "costs.json"
    both = {"device": "GPU", "model": "M", "num_params_b": 1.0, "date": "d", "command": "c",
            "terms": {"training_s_per_ktoken": [[8, 0.1]], "generate_s_per_ktoken": [[0.5, 0.06]]}}
    write_profile(both, costs)
    training_only = {**both, "terms": {"training_s_per_ktoken": [[8, 0.09]], "generate_s_per_ktoken": []}}
    assert bench_costs.terms_it_would_lose(training_only, costs) == ["generate"]
    assert bench_costs.terms_it_would_lose({**training_only, "model": "N"}, costs) == []  # a new shape loses nothing
    assert bench_costs.terms_it_would_lose({**training_only, "model": "N"}, tmp_path / "absent.json") == []
    assert bench_costs.terms_it_would_lose(both, costs) == []
    nothing = {**both, "terms": {"training_s_per_ktoken": [], "generate_s_per_ktoken": []}}
    assert bench_costs.terms_it_would_lose(nothing, tmp_path / "absent.json") == ["training", "generate"]


def test_every_gpu_point_names_its_async_scheduling_as_vllm_would_otherwise_turn_it_on():
    import tune_generate_costs as bench_generate

    assert bench_generate.point_overrides("util_0.3", 128, "cuda")[-1] == bench_costs.ASYNC_OFF
    assert bench_generate.point_overrides("util_0.3-async", 128, "cuda")[-1] == f"{bench_costs.ASYNC_KEY}=true"
    for point in ("budget_8", "nockpt_8", "compile_8", "util_0.7"):
        assert bench_costs.ASYNC_OFF in bench_costs.point_overrides(point, 528, "cuda"), point
    assert f"{bench_costs.ASYNC_KEY}=true" in bench_costs.point_overrides("async_8", 528, "cuda")
    assert not any(k.startswith(bench_costs.ASYNC_KEY) for k in bench_costs.point_overrides("budget_8", 528, "cpu"))


def test_rounds_alternate_the_launch_order():
    plans = [bench_tune.Plan("c", v, Path(f"{v}.yaml"), "") for v in ("untuned", "tuned", "hand")]
    order = [(r, p.variant) for r, p in bench_tune.launch_order(plans, 3)]
    assert order == [(1, "untuned"), (1, "tuned"), (1, "hand"), (2, "hand"), (2, "tuned"), (2, "untuned"),
                     (3, "untuned"), (3, "tuned"), (3, "hand")]


def test_a_fit_refuses_parked_and_unparked_training_calls_together(tmp_path):
    common = {"device": "cpu", "model": "Qwen2.5-1.5B", "date": "2000-01-01", "commit": None, "measured": "in_process",
              "num_params_b": 1.5, "command": "bench/tune_training_costs.py",
              "points": [{"point": "budget_8", "training_s_per_ktoken": 0.02, "training_rounds": [0.02, 0.02]}]}
    files = []
    for parked in (True, False):
        files.append(tmp_path / f"parked_{parked}.json")
        files[-1].write_text(json.dumps({**common, "workload": {"parked": parked}}))
    with pytest.raises(SystemExit, match="--park"):
        bench_costs.fit(files)
    assert bench_costs.fit(files[:1])["terms"]["training_s_per_ktoken"] == [[8.0, 0.02]]


def test_an_awake_generation_point_gives_keep_awake_factor_and_stays_out_of_the_curve(tmp_path):
    """util_0.3-async-awake against util_0.3-async, round by round over the rollout's part of a round (push,
    generate, sleep and wakes): ratios 0.9, 0.8, 0.85, median 0.85. Its generate time per token is not a point of
    the utilization curve, nor does it pair with the async factor."""
    import tune_generate_costs as bench_generate

    assert bench_generate.parse_point("util_0.3-async-awake") == (0.3, True, True, False)
    assert bench_generate.parse_point("util_0.5-awake") == (0.5, False, True, False)
    assert bench_generate.parse_point("util_0.3+async") == (0.3, True, False, False)
    for bad in ("util_0.3-awake-awake", "util_0.3-fast", "budget_8-awake", "util_0.3-awake-mp"):
        with pytest.raises(ValueError):
            bench_generate.parse_point(bad)
    knobs = bench_generate.point_overrides("util_0.3-async-awake", 128, "cuda")
    assert "actor_rollout_ref.rollout.free_cache_engine=false" in knobs and f"{bench_costs.ASYNC_KEY}=true" in knobs
    assert not any("free_cache_engine" in k for k in bench_generate.point_overrides("util_0.3-async", 128, "cuda"))
    common = {"device": "cpu", "model": "Qwen2.5-0.5B", "date": "2000-01-01", "commit": None, "workload": {},
              "measured": "in_process", "num_params_b": 0.49}
    training = {**common, "command": "bench/tune_training_costs.py", "points": [
        {"point": "budget_8", "training_s_per_ktoken": 0.02, "training_rounds": [0.02, 0.02]}]}
    generation = {**common, "command": "bench/tune_generate_costs.py", "terms": "generation", "points": [
        {"point": "util_0.3", "utilization": 0.3, "async_scheduling": False, "awake": False,
         "generate_s_per_ktoken": 0.04, "generate_rounds": [0.04, 0.04, 0.04], "rollout_rounds": [3.0, 3.0, 3.0],
         "knobs": [bench_costs.ASYNC_OFF]},
        {"point": "util_0.3-async", "utilization": 0.3, "async_scheduling": True, "awake": False,
         "generate_s_per_ktoken": 0.03, "generate_rounds": [0.03, 0.03, 0.03], "rollout_rounds": [2.0, 2.5, 2.0]},
        {"point": "util_0.3-async-awake", "utilization": 0.3, "async_scheduling": True, "awake": True,
         "generate_s_per_ktoken": 0.02, "generate_rounds": [0.01, 0.02, 0.03], "rollout_rounds": [1.8, 2.0, 1.7]},
        {"point": "util_0.3-awake", "utilization": 0.3, "async_scheduling": False, "awake": True,
         "generate_s_per_ktoken": 0.02, "generate_rounds": [0.01, 0.02, 0.03], "rollout_rounds": [2.7, 2.7, 2.7],
         "knobs": [bench_costs.ASYNC_OFF]}]}
    files = []
    for name, call in (("training", training), ("generation", generation)):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(call))
    terms = bench_costs.fit(files)["terms"]
    # per call the median of the two awake points' medians: 0.85 (async) and 0.9 (plain: 2.7 ÷ 3.0 each round)
    assert terms["keep_awake_factor"] == 0.875
    assert terms["generate_s_per_ktoken"] == [[0.3, 0.04]]  # the plain asleep engine's alone, not util_0.3-awake's
    assert terms["async_scheduling_factor"] == 0.75  # the asleep async engine's, not the awake one's
    # The spread: the async-awake ratios 0.9, 0.8, 0.85 scatter by 2 × 0.05 ÷ 0.85 = 0.1176; the awake points'
    # generate rounds (0.01, 0.02, 0.03: a spread of 0.99 against util_0.3's), which leave out the KV cache's wake,
    # are not compared with the others'.
    assert terms["generate_spread"] == pytest.approx(0.1176, abs=1e-4)
    bench_generate.check_points(["util_0.3-async", "util_0.3-async-awake", "util_0.5"], "cuda")
    with pytest.raises(SystemExit, match="twin util_0.3-async is not among"):
        bench_generate.check_points(["util_0.3", "util_0.3-async-awake"], "cuda")
    with pytest.raises(SystemExit, match="over 0.85"):  # 0.3 held, 0.7 waking beside it
        bench_generate.check_points(["util_0.3", "util_0.3-awake", "util_0.7"], "cuda")
    bench_generate.check_points(["util_0.3", "util_0.3-awake", "util_0.7"], "cpu")  # the CPU pipeline holds none


def test_an_mp_generation_point_gives_own_processes_factor_against_its_in_process_twin(tmp_path):
    """util_0.3-async-mp against util_0.3-async, round by round over the rollout's part of a round: ratios 0.6,
    0.5, 0.55, median 0.55; util_0.3-mp against util_0.3: 0.5. Their generate rounds stay out of the curve, the
    async factor and the spread's pairs."""
    import tune_generate_costs as bench_generate

    assert bench_generate.parse_point("util_0.3-async-mp") == (0.3, True, False, True)
    knobs = bench_generate.point_overrides("util_0.3-async-mp", 128, "cuda")
    assert "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend=mp" in knobs
    with pytest.raises(SystemExit, match="twin util_0.3-async is not among"):
        bench_generate.check_points(["util_0.3", "util_0.3-async-mp"], "cuda")
    common = {"device": "cpu", "model": "Qwen2.5-0.5B", "date": "2000-01-01", "commit": None, "workload": {},
              "measured": "in_process", "num_params_b": 0.49, "command": "bench/tune_generate_costs.py",
              "terms": "generation"}
    call = {**common, "points": [
        {"point": "util_0.3", "utilization": 0.3, "async_scheduling": False, "awake": False, "own_processes": False,
         "generate_s_per_ktoken": 0.04, "generate_rounds": [0.04, 0.04, 0.04], "rollout_rounds": [3.0, 3.0, 3.0],
         "knobs": [bench_costs.ASYNC_OFF]},
        {"point": "util_0.3-async", "utilization": 0.3, "async_scheduling": True, "awake": False,
         "own_processes": False, "generate_s_per_ktoken": 0.03, "generate_rounds": [0.03, 0.03, 0.03],
         "rollout_rounds": [2.0, 2.0, 2.0]},
        {"point": "util_0.3-async-mp", "utilization": 0.3, "async_scheduling": True, "awake": False,
         "own_processes": True, "generate_s_per_ktoken": 0.01, "generate_rounds": [0.005, 0.01, 0.02],
         "rollout_rounds": [1.2, 1.0, 1.1]},
        {"point": "util_0.3-mp", "utilization": 0.3, "async_scheduling": False, "awake": False, "own_processes": True,
         "generate_s_per_ktoken": 0.01, "generate_rounds": [0.01, 0.01, 0.01], "rollout_rounds": [1.5, 1.5, 1.5],
         "knobs": [bench_costs.ASYNC_OFF]}]}
    path = tmp_path / "generation.json"
    path.write_text(json.dumps(call))
    terms = bench_costs.fit([path])["terms"]
    # the median of the two mp points' medians: 0.55 (async, against util_0.3-async) and 0.5 (against util_0.3)
    assert terms["own_processes_factor"] == 0.525 and "keep_awake_factor" not in terms
    # util_0.3-mp's generate time (0.01) is no point of the curve, nor does it pair with the async factor
    assert terms["generate_s_per_ktoken"] == [[0.3, 0.04]] and terms["async_scheduling_factor"] == 0.75
    # its ratios 0.6, 0.5, 0.55 scatter by 2 × 0.05 ÷ 0.55; the plain pair's by 0
    assert terms["generate_spread"] == pytest.approx(2 * 0.05 / 0.55, abs=1e-4)
