"""`rlconf tune`'s throughput model: the cost file's states (unmeasured, measured, unreadable) and the choices a
measured profile changes. The profiles below are test fixtures written into tmp files, not measurements: they
only check that the tuner follows whatever the file says."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlconf.render_tune import tune_json
from rlconf.tune import SAFETY, peak, tune
from rlconf.tune_costs import COSTS_FILE, CostFileError, load_costs, write_profile

PRESETS = Path(__file__).resolve().parents[2] / "presets"
PRESET = PRESETS / "grpo_7b_8gpu.yaml"  # prompt 512 + response 1024 = 1536 tokens a sequence; 80 GiB GPUs
SEQ = 1536
BUDGET = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
CKPT = "actor_rollout_ref.model.enable_gradient_checkpointing"
UTIL = "actor_rollout_ref.rollout.gpu_memory_utilization"
ASYNC = "actor_rollout_ref.rollout.engine_kwargs.vllm.async_scheduling"
COMPILE = "actor_rollout_ref.model.compile_layers"


def fixture_profile(**terms) -> dict:
    return {"device": "test fixture", "model": "Qwen2.5-7B", "num_params_b": 7.6, "date": "2000-01-01",
            "command": "tests/compiler/test_tune_costs.py", "commit": None, "terms": terms}


def cost_file(tmp_path: Path, *profiles: dict) -> Path:
    path = tmp_path / "costs.json"
    path.write_text(json.dumps({"schema_version": 1, "profiles": list(profiles)}))
    return path


def _empty(folder: Path) -> Path:
    path = folder / "empty.json"
    path.write_text(json.dumps({"schema_version": 1, "profiles": []}))
    return path


def test_every_shipped_profile_says_where_its_numbers_come_from():
    table = load_costs(COSTS_FILE)  # raises on a profile without device, date, command
    for profile in table.profiles:
        assert profile.device and profile.date and profile.command
        assert profile.training_s_per_ktoken or profile.generate_s_per_ktoken or profile.factors


def test_without_a_measured_profile_the_tuner_says_so_and_takes_the_largest_budget(tmp_path):
    result = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path))
    assert result.throughput_state == "unmeasured"
    assert "unmeasured" in result.throughput_note and "guide" in result.throughput_note
    plain = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path))
    assert result.overrides == plain.overrides
    budget = result.after.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    assert budget > 4 * SEQ  # the guide's rule: the largest that fits (31 sequences at 80 GiB)


def test_a_flat_measured_curve_keeps_the_smallest_budget_within_tolerance(tmp_path):
    # Training time per token falls until 4 sequences a micro batch, then is flat: beyond 4 nothing is gained.
    costs = cost_file(tmp_path, fixture_profile(training_s_per_ktoken=[[1, 2.0], [4, 1.0], [64, 0.99]]))
    result = tune(PRESET, gpu_memory_gib=80, costs=costs)
    assert result.throughput_state == "measured" and "test fixture" in result.throughput_note
    assert result.after.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 4 * SEQ
    why = {c.key: c.why for c in result.changes}[BUDGET]
    assert "throughput model" in why and "within 3%" in why
    assert result.fits and result.after.errors == [] and result.after.warnings == []


def test_a_rising_measured_curve_keeps_the_largest_budget(tmp_path):
    # Steep enough that one more sequence a micro batch is always > 3% faster: the largest that fits wins.
    costs = cost_file(tmp_path, fixture_profile(training_s_per_ktoken=[[1, 1000.0], [64, 1.0]]))
    measured = tune(PRESET, gpu_memory_gib=80, costs=costs)
    guide = tune(PRESET, gpu_memory_gib=80, costs=_empty(tmp_path))
    assert (measured.after.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
            == guide.after.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu)


@pytest.mark.parametrize("factor, key, changed, why", [
    ("checkpointing_off_factor", CKPT, False, "checkpointing off: measured ×0.70"),
    ("compile_layers_factor", COMPILE, True, "compile_layers): measured ×0.70")])
def test_a_training_knob_moves_only_when_measured_faster_and_the_plan_still_fits(tmp_path, factor, key, changed, why):
    curve = [[1, 2.0], [4, 1.0], [64, 0.99]]
    faster = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(
        training_s_per_ktoken=curve, **{factor: 0.7})))
    model = faster.after.config.actor_rollout_ref.model
    assert getattr(model, key.rsplit(".", 1)[1]) is changed
    assert why in {c.key: c.why for c in faster.changes}[key]
    assert faster.fits and peak(faster.after) * SAFETY <= 80
    assert faster.after.errors == [] and faster.after.warnings == []
    same = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(
        training_s_per_ktoken=curve, **{factor: 0.99})))  # within the tolerance: not worth it
    assert getattr(same.after.config.actor_rollout_ref.model, key.rsplit(".", 1)[1]) is not changed
    assert key not in {c.key for c in same.changes}


def test_a_flat_measured_generate_curve_keeps_vllm_at_the_lowest_utilization_within_tolerance(tmp_path):
    costs = cost_file(tmp_path, fixture_profile(generate_s_per_ktoken=[[0.3, 0.2], [0.5, 0.1], [0.7, 0.099]]))
    result = tune(PRESET, gpu_memory_gib=80, costs=costs)
    assert result.after.config.actor_rollout_ref.rollout.gpu_memory_utilization == 0.5
    assert "measured generate time" in {c.key: c.why for c in result.changes}.get(UTIL, "measured generate time")
    plain = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path))
    assert plain.after.config.actor_rollout_ref.rollout.gpu_memory_utilization == 0.7


def test_objective_memory_ignores_the_throughput_model(tmp_path):
    costs = cost_file(tmp_path, fixture_profile(training_s_per_ktoken=[[1, 2.0], [64, 0.5]],
                                                generate_s_per_ktoken=[[0.3, 0.1], [0.7, 0.1]]))
    _empty(tmp_path)
    assert (tune(PRESET, gpu_memory_gib=80, objective="memory", costs=costs).overrides
            == tune(PRESET, gpu_memory_gib=80, objective="memory", costs=tmp_path / "empty.json").overrides)


def test_a_profile_of_another_size_is_applied_as_relative_costs_and_said_so(tmp_path):
    profile = dict(fixture_profile(training_s_per_ktoken=[[1, 2.0], [64, 1.0]]), model="Qwen2.5-3B",
                   num_params_b=3.09)  # the preset's 7.6B is 2.5× away: within reach
    result = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, profile))
    assert result.throughput_state == "measured" and "not measured at this size" in result.throughput_note


def test_a_profile_more_than_its_reach_off_in_size_is_not_applied(tmp_path):
    profile = dict(fixture_profile(training_s_per_ktoken=[[1, 2.0], [64, 1.0]], checkpointing_off_factor=0.5),
                   model="Qwen2.5-0.5B", num_params_b=0.49)
    result = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, profile))
    # The preset's 7.62B is 15.5× the profile's 0.49B: beyond PROFILE_REACH (8×).
    assert result.throughput_state == "unmeasured" and "more than 8× off in size" in result.throughput_note
    guide = tune(PRESET, gpu_memory_gib=80, costs=_empty(tmp_path))
    assert result.overrides == guide.overrides
    within = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, dict(profile, num_params_b=7.62 / 7.9)))
    assert within.throughput_state == "measured"  # 7.9× off: still within reach


def test_a_profile_without_provenance_is_refused_with_the_missing_fields(tmp_path):
    profile = fixture_profile(training_s_per_ktoken=[[1, 1.0]])
    del profile["device"], profile["command"]
    with pytest.raises(CostFileError, match="missing device, command"):
        load_costs(cost_file(tmp_path, profile))
    result = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, profile))
    assert result.throughput_state == "unreadable" and "missing device, command" in result.throughput_note
    assert result.fits  # the guide's order still tunes


def test_negative_seconds_and_a_zero_size_are_refused(tmp_path):
    with pytest.raises(CostFileError, match="must be > 0"):
        load_costs(cost_file(tmp_path, fixture_profile(generate_s_per_ktoken=[[0.5, -1]])))
    with pytest.raises(CostFileError, match="num_params_b"):
        load_costs(cost_file(tmp_path, dict(fixture_profile(), num_params_b=0.0)))


def test_write_profile_replaces_the_same_device_and_model(tmp_path):
    path = cost_file(tmp_path)
    write_profile(fixture_profile(training_s_per_ktoken=[[1, 2.0]]), path)
    write_profile(fixture_profile(training_s_per_ktoken=[[1, 3.0]]), path)
    table = load_costs(path)
    assert len(table.profiles) == 1 and table.profiles[0].training_s_per_ktoken == ((1.0, 3.0),)


def test_of_profiles_as_near_in_size_the_one_written_last_applies(tmp_path):
    path = cost_file(tmp_path)
    write_profile(fixture_profile(training_s_per_ktoken=[[1, 2.0]]), path)
    write_profile(dict(fixture_profile(training_s_per_ktoken=[[1, 3.0]]), device="the same GPU, another driver"), path)
    table = load_costs(path)
    assert len(table.profiles) == 2
    assert table.profile_for(table.profiles[0].num_params_b).training_s_per_ktoken == ((1.0, 3.0),)
    assert table.profile_for(None).device == "the same GPU, another driver"


def test_the_json_output_names_the_throughput_models_state(tmp_path):
    from rlconf.render_tune import tune_json

    answer = json.loads(tune_json(tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path))))
    assert answer["throughput_model"]["state"] == "unmeasured"


def test_the_curve_decides_only_inside_its_measured_range(tmp_path):
    # Flat from 8 sequences a micro batch to the whole mini batch (160): nothing says 2 or 4 are as fast (the
    # curve holds its end value beyond its points), so the smallest measured budget that fits is the choice.
    costs = cost_file(tmp_path, fixture_profile(training_s_per_ktoken=[[8, 1.0], [160, 0.995]]))
    result = tune(PRESET, gpu_memory_gib=80, costs=costs)
    assert result.after.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 8 * SEQ
    # Measured only up to 8: the budgets that fit reach past it, where the curve says nothing: the guide's
    # largest that fits, and the reason says why.
    short = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(
        training_s_per_ktoken=[[2, 2.0], [8, 1.0]])))
    guide = tune(PRESET, gpu_memory_gib=80, costs=_empty(tmp_path))
    assert (short.after.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
            == guide.after.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu > 8 * SEQ)
    assert "measured micro batches of 2 to 8 sequences" in {c.key: c.why for c in short.changes}[BUDGET]


def test_async_scheduling_follows_the_measurement_either_way_and_a_plans_own_choice_stays(tmp_path):
    faster = cost_file(tmp_path, fixture_profile(async_scheduling_factor=0.85))
    result = tune(PRESET, gpu_memory_gib=80, costs=faster)
    assert result.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm["async_scheduling"] is True
    assert f"{ASYNC}=true" in result.overrides
    assert result.fits and result.after.errors == [] and result.after.warnings == []
    # Measured slower: off by name, since vLLM 0.25 turns it on when the key is unset.
    slower = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(async_scheduling_factor=1.2)))
    assert slower.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm["async_scheduling"] is False
    assert "measured ×1.20 generate time" in {c.key: c.why for c in slower.changes}[ASYNC]
    same = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(async_scheduling_factor=1.02)))
    assert "async_scheduling" not in same.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm
    assert "measured ×1.02 generate time" in {c.key: c.why for c in same.considered}[ASYNC]
    unmeasured = tune(PRESET, gpu_memory_gib=80, costs=_empty(tmp_path))
    assert "async_scheduling" not in unmeasured.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm
    kept = tune(PRESET, [f"{ASYNC}=false"], gpu_memory_gib=80, costs=faster)
    assert kept.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm["async_scheduling"] is False
    assert ASYNC not in {c.key for c in kept.changes}


def test_a_factor_inside_the_launches_own_spread_decides_nothing(tmp_path):
    curve = [[1, 2.0], [4, 1.0], [64, 0.99]]
    noisy = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(
        training_s_per_ktoken=curve, checkpointing_off_factor=0.8, training_spread=0.25)))
    assert noisy.after.config.actor_rollout_ref.model.enable_gradient_checkpointing is True
    weighed = {c.key: c.why for c in noisy.considered}
    assert "tolerance, 25% (the scatter between its repeated" in weighed[CKPT]
    assert CKPT in {c["key"] for c in json.loads(tune_json(noisy))["considered"]}
    clear = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(
        training_s_per_ktoken=curve, checkpointing_off_factor=0.8, training_spread=0.1)))
    assert clear.after.config.actor_rollout_ref.model.enable_gradient_checkpointing is False
    assert CKPT not in {c.key for c in clear.considered}


def test_a_spread_outside_zero_to_one_is_refused(tmp_path):
    with pytest.raises(CostFileError, match="training_spread"):
        load_costs(cost_file(tmp_path, fixture_profile(training_s_per_ktoken=[[1, 1.0]], training_spread=1.5)))


def test_a_trade_the_rules_refuse_says_which_rule(tmp_path):
    result = tune(PRESET, ["actor_rollout_ref.model.use_liger=true"], gpu_memory_gib=80, costs=cost_file(
        tmp_path, fixture_profile(training_s_per_ktoken=[[1, 2.0], [4, 1.0], [64, 0.99]], compile_layers_factor=0.7)))
    assert result.after.config.actor_rollout_ref.model.compile_layers is False
    assert "the plan with it is refused (RL526)" in {c.key: c.why for c in result.considered}[COMPILE]


def test_a_profile_without_generation_terms_takes_the_nearest_ones_within_reach(tmp_path):
    small = dict(fixture_profile(training_s_per_ktoken=[[8, 0.08]], generate_s_per_ktoken=[[0.3, 0.06], [0.7, 0.05]],
                                 async_scheduling_factor=0.9, generate_spread=0.1, compile_layers_factor=0.7),
                 model="Qwen2.5-0.5B", num_params_b=0.5)
    middle = dict(fixture_profile(training_s_per_ktoken=[[8, 0.09]], compile_layers_factor=0.77),
                  model="Qwen2.5-1.5B", num_params_b=1.5)
    table = load_costs(cost_file(tmp_path, small, middle))
    at_1_5 = table.profile_for(1.5, 8.0)
    assert at_1_5.training_s_per_ktoken == ((8.0, 0.09),) and at_1_5.factor("compile_layers_factor") == 0.77
    assert at_1_5.generate_s_per_ktoken == ((0.3, 0.06), (0.7, 0.05))
    assert at_1_5.factor("async_scheduling_factor") == 0.9 and at_1_5.tolerance("generate") == 0.1
    assert at_1_5.generation_from.model == "Qwen2.5-0.5B" and "generation terms from Qwen2.5-0.5B" in at_1_5.describe()
    # 7.6B: the 1.5B training terms (5.1× off), but the 0.5B generation ones are 15× off, beyond the reach
    at_7 = table.profile_for(7.6, 8.0)
    assert at_7.model == "Qwen2.5-1.5B" and not at_7.generate_s_per_ktoken and at_7.generation_from is None
    assert table.profile_for(1.5, 2.0).generation_from is None  # 3× off, beyond a reach of 2
    assert table.profile_for(0.5, 8.0).generation_from is None  # the nearest has its own


def test_a_generation_only_profile_written_last_keeps_the_training_terms_of_the_same_size(tmp_path):
    # A 1.5B generation bench on another GPU, written after a 1.5B profile of both kinds: as near in size and
    # written last, it is the choice, and it must not hide the training curve the other one measured.
    both = dict(fixture_profile(training_s_per_ktoken=[[8, 0.09], [64, 0.07]], generate_s_per_ktoken=[[0.3, 0.06]],
                                compile_layers_factor=0.77, training_spread=0.05, generate_spread=0.3),
                model="Qwen2.5-1.5B", num_params_b=1.5, device="GPU A")
    generation = dict(fixture_profile(generate_s_per_ktoken=[[0.3, 0.04]], keep_awake_factor=0.85,
                                      generate_spread=0.08),
                      model="Qwen2.5-1.5B", num_params_b=1.5, device="GPU B")
    table = load_costs(cost_file(tmp_path, both, generation))
    chosen = table.profile_for(1.5, 8.0)
    assert chosen.device == "GPU A" and chosen.training_s_per_ktoken == ((8.0, 0.09), (64.0, 0.07))
    assert chosen.factor("compile_layers_factor") == 0.77 and chosen.tolerance("training") == 0.05
    assert chosen.generate_s_per_ktoken == ((0.3, 0.04),) and chosen.factor("keep_awake_factor") == 0.85
    assert chosen.tolerance("generate") == 0.08 and chosen.generation_from.device == "GPU B"
    assert "its generation terms from Qwen2.5-1.5B on GPU B" in chosen.describe()
    # No training profile within reach: the generation-only one alone (the guide then decides the training knobs).
    alone = load_costs(cost_file(tmp_path, dict(both, num_params_b=7.6, model="Qwen2.5-7B"), generation))
    assert alone.profile_for(1.5, 2.0).device == "GPU B" and not alone.profile_for(1.5, 2.0).training_s_per_ktoken


def test_a_measured_generation_curve_decides_vllms_share_instead_of_the_rounds_kv_cache(tmp_path):
    """The 64-prompt plan of test_tune.py's KV case stops at 0.3 by the round's KV cache; a profile that measured
    0.7 faster by more than its tolerance (the 7.6B fixture: the same size) takes 0.7 instead."""
    small_round = ["data.train_batch_size=64", "actor_rollout_ref.actor.ppo_mini_batch_size=32",
                   "critic.ppo_mini_batch_size=32"]
    faster_high = cost_file(tmp_path, fixture_profile(generate_s_per_ktoken=[[0.3, 0.10], [0.7, 0.05]]))
    chosen = tune(PRESET, small_round, 80, costs=faster_high)
    assert chosen.after.config.actor_rollout_ref.rollout.gpu_memory_utilization == 0.7


def test_the_rounds_kv_cache_splits_over_no_more_gpus_than_kv_heads(tmp_path):
    """Qwen2.5-1.5B has 2 kv heads: at tensor parallel 4 each GPU holds one (vLLM replicates them), so a token's KV
    cache a GPU is 2 × 28 layers × 1 × 128 × 2 B = 14,336 B, not a quarter of 28,672. Two replicas of 4 GPUs:
    64 prompts × n 5 ÷ 2 = 160 sequences (on the graph grid: 160) × 1,536 tokens × 14,336 B = 3.28 GiB."""
    plan = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-1.5B-Instruct", "data.train_batch_size=64",
            "actor_rollout_ref.actor.ppo_mini_batch_size=32", "critic.ppo_mini_batch_size=32",
            "actor_rollout_ref.rollout.tensor_model_parallel_size=4"]
    result = tune(PRESET, plan, 80, costs=_empty(tmp_path))
    why = {c.key: c.why for c in result.changes}[UTIL]
    assert "a replica's round: 160 sequences" in why and "(3.28 GiB)" in why


def test_keeping_vllm_awake_follows_its_measured_factor_where_the_share_fits(tmp_path):
    """ppo_critic_split on 80 GiB: vLLM's share fits beside the tuned training phase. Measured faster by more than
    the generation tolerance, the tuner keeps vLLM awake and says the factor; within it, or unmeasured, the plan
    keeps its sleep and the output says why."""
    plan = PRESETS / "ppo_critic_split.yaml"
    awake_key = "actor_rollout_ref.rollout.free_cache_engine"
    faster = tune(plan, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(keep_awake_factor=0.9)))
    assert faster.after.config.actor_rollout_ref.rollout.free_cache_engine is False
    assert "measured ×0.90 the rollout's time a step" in {c.key: c.why for c in faster.changes}[awake_key]
    assert faster.fits and faster.after.errors == [] and faster.after.warnings == []
    assert peak(faster.after) * SAFETY <= 80
    noisy = tune(plan, gpu_memory_gib=80,
                 costs=cost_file(tmp_path, fixture_profile(keep_awake_factor=0.9, generate_spread=0.15)))
    assert noisy.after.config.actor_rollout_ref.rollout.free_cache_engine is True
    assert "not faster by more than the profile's tolerance, 15%" in {c.key: c.why for c in noisy.considered}[awake_key]
    unmeasured = tune(plan, gpu_memory_gib=80, costs=_empty(tmp_path))
    assert unmeasured.after.config.actor_rollout_ref.rollout.free_cache_engine is True
    assert "is not taken: measured 1.11x" in {c.key: c.why for c in unmeasured.considered}[awake_key]
    # Where the share does not fit beside training (the 7B preset at 80 GiB), no factor takes it.
    tight = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(keep_awake_factor=0.5)))
    assert tight.after.config.actor_rollout_ref.rollout.free_cache_engine is True


def test_vllm_in_processes_of_its_own_follows_its_measured_factor_where_a_replica_has_one_gpu(tmp_path):
    """ppo_critic_split (rollout tensor parallel 1): measured faster by more than the generation tolerance, the
    tuner runs vLLM in processes of its own (mp); within it, or unmeasured, it stays in process, the output saying
    why. The 7B preset's replicas are tensor parallel over 2 GPUs, which only the in-process layout runs (RL372)."""
    plan = PRESETS / "ppo_critic_split.yaml"
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend"
    faster = tune(plan, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(own_processes_factor=0.6)))
    assert faster.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm[key.rsplit(".", 1)[1]] == "mp"
    assert "measured ×0.60 the rollout's time a step" in {c.key: c.why for c in faster.changes}[key]
    assert faster.fits and faster.after.errors == [] and faster.after.warnings == []
    noisy = tune(plan, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(own_processes_factor=0.9,
                                                                                     generate_spread=0.15)))
    assert "distributed_executor_backend" not in noisy.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm
    assert "not faster by more than the profile's tolerance, 15%" in {c.key: c.why for c in noisy.considered}[key]
    unmeasured = tune(plan, gpu_memory_gib=80, costs=_empty(tmp_path))
    assert key not in {c.key for c in (*unmeasured.changes, *unmeasured.considered)}
    kept = tune(plan, [f"{key}=external_launcher"], gpu_memory_gib=80,
                costs=cost_file(tmp_path, fixture_profile(own_processes_factor=0.6)))
    assert kept.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm[key.rsplit(".", 1)[1]] == "external_launcher"
    tensor_parallel = tune(PRESET, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(
        own_processes_factor=0.6)))
    assert "distributed_executor_backend" not in tensor_parallel.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm
    assert "runs in process only (RL372)" in {c.key: c.why for c in tensor_parallel.considered}[key]


def test_mp_is_taken_only_where_it_was_measured_and_where_rl372_lets_it_run(tmp_path):
    """Measured on the colocated step with vLLM asleep: never on a rollout pool of its own, never kept awake with
    it (the keep-awake factor then yields, said under weighed), never with the plan's own worker extension."""
    plan = PRESETS / "ppo_critic_split.yaml"
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend"
    both = tune(plan, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(
        own_processes_factor=0.6, keep_awake_factor=0.5)))
    assert both.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm["distributed_executor_backend"] == "mp"
    assert both.after.config.actor_rollout_ref.rollout.free_cache_engine is True
    assert "never measured together" in {c.key: c.why for c in both.considered}["actor_rollout_ref.rollout.free_cache_engine"]
    assert both.fits and both.after.errors == []
    extension = tune(plan, ["+actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls=my.Ext"],
                     gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(own_processes_factor=0.6)))
    assert "distributed_executor_backend" not in extension.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm
    assert "worker_extension_cls (RL372)" in {c.key: c.why for c in extension.considered}[key]
    assert extension.fits
    off_policy = tune(PRESET, ["actor_rollout_ref.hybrid_engine=false", "actor_rollout_ref.rollout.nnodes=1",
                               "actor_rollout_ref.rollout.n_gpus_per_node=2",
                               "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                               "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
                               "algorithm.rollout_correction.bypass_mode=true"],
                      gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(own_processes_factor=0.6)))
    assert off_policy.before.resolved.schedule.mode == "one_step_off_policy", off_policy.before.errors
    assert "distributed_executor_backend" not in off_policy.after.config.actor_rollout_ref.rollout.engine_kwargs.vllm
    slower = tune(plan, gpu_memory_gib=80, costs=cost_file(tmp_path, fixture_profile(own_processes_factor=1.3)))
    assert "slower" in {c.key: c.why for c in slower.considered}[key]
