"""`rlconf tune`: the guide's knobs searched with the compiler's estimate; the training itself never changes.

Hand-checked cases on the bundled presets (80 GiB GPUs unless said: a plan fits when its estimate
× SAFETY 1.15 is at most 69.6 GiB).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlconf.cli import app
from rlconf.compile import compile_plan
from rlconf.tune import SAFETY, divisors, peak, tune, tuned_plan_yaml

PRESETS = Path(__file__).resolve().parents[2] / "presets"
GPU_PRESETS = ["grpo_7b_8gpu.yaml", "long_context_ulysses.yaml", "memory_lean.yaml", "ppo_critic_split.yaml"]
ALL_PRESETS = sorted(p.name for p in PRESETS.glob("*.yaml"))


def no_profile(folder: Path) -> Path:
    """A cost file with no measured profile: the guide's order alone, whatever rlconf/tune_costs.json holds."""
    path = folder / "costs.json"
    path.write_text(json.dumps({"schema_version": 1, "profiles": []}))
    return path


def algorithmic(config) -> dict:
    """What the training is: tuning must leave every one of these as it was."""
    arr = config.actor_rollout_ref
    return {"train_batch_size": config.data.train_batch_size, "n": arr.rollout.n,
            "mini": arr.actor.ppo_mini_batch_size, "epochs": arr.actor.ppo_epochs,
            "prompt": config.data.max_prompt_length, "response": config.data.max_response_length,
            "model": arr.model.path, "estimator": config.algorithm.adv_estimator, "lr": arr.actor.optim.lr,
            "critic_mini": config.critic.ppo_mini_batch_size, "world": (config.trainer.nnodes, config.trainer.n_gpus_per_node),
            "temperature": arr.rollout.temperature, "kl": (arr.actor.use_kl_loss, config.algorithm.use_kl_in_reward)}


@pytest.mark.parametrize("preset", ALL_PRESETS)
@pytest.mark.parametrize("dynamic", [True, False], ids=["dynamic", "fixed"])
def test_the_tuned_plan_breaks_no_rule_and_keeps_the_training(preset, dynamic):
    result = tune(PRESETS / preset, dynamic=dynamic)
    assert result.fits, result.why_not
    assert result.after.errors == [] and result.after.warnings == [], [d.message for d in result.after.diagnostics]
    assert algorithmic(result.after.config) == algorithmic(result.before.config)
    assert peak(result.after) * SAFETY <= result.gpu_memory_gib


@pytest.mark.parametrize("preset", GPU_PRESETS)
def test_budgets_follow_the_guides_ratios(preset):
    result = tune(PRESETS / preset)
    config, roles = result.after.config, result.after.resolved.roles
    seq = roles.rollout.prompt_length + roles.rollout.response_length
    actor = config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    assert config.actor_rollout_ref.actor.use_dynamic_bsz
    assert actor * roles.actor.sp_size >= 2 * seq  # the guide's floor: 2 × (prompt + response)
    assert roles.rollout.log_prob.max_token_len_per_gpu == 2 * actor  # forward only: 2× the training budget
    if roles.critic is not None:
        assert config.critic.ppo_max_token_len_per_gpu >= 2 * actor  # critic ≥ 2× actor


def test_the_actors_budget_is_the_largest_balanced_micro_batch_that_fits(tmp_path):
    # Packed rows: the engine cuts the mini batch's 160 rows a GPU into the fewest micro batches the budget
    # allows and balances them, so the candidates are ⌈160 ÷ count⌉ full rows; the next size up does not fit.
    result = tune(PRESETS / "grpo_7b_8gpu.yaml", costs=no_profile(tmp_path))  # the guide's rule, no measured curve
    seq, rows = 512 + 1024, result.before.resolved.roles.actor.ppo_mini_batch_size_per_gpu
    assert rows == 160
    chosen = result.after.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu
    count = -(-rows // (chosen // seq))
    assert chosen == -(-rows // count) * seq and chosen > 2 * seq
    bigger = compile_plan(PRESETS / "grpo_7b_8gpu.yaml", [*result.overrides, f"estimate.gpu_memory_gib={result.gpu_memory_gib:g}",
                                                          f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu="
                                                          f"{-(-rows // (count - 1)) * seq}"])
    assert peak(bigger) * SAFETY > result.gpu_memory_gib


def test_fixed_micro_batches_take_the_largest_divisor_of_the_mini_batch_that_fits():
    # grpo_7b_8gpu: 160 sequences per GPU per mini batch. At 80 GiB 20 fits and 32 does not.
    result = tune(PRESETS / "grpo_7b_8gpu.yaml", dynamic=False)
    roles = result.after.resolved.roles
    micro, mini = roles.actor.ppo_micro_batch_size_per_gpu, roles.actor.ppo_mini_batch_size_per_gpu
    assert mini % micro == 0
    larger = [d for d in divisors(mini) if d > micro]
    assert larger, "the mini batch itself would fit: the case checks nothing"
    next_up = compile_plan(PRESETS / "grpo_7b_8gpu.yaml", [*result.overrides, f"estimate.gpu_memory_gib={result.gpu_memory_gib:g}",
                                                           f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={larger[0]}"])
    assert peak(next_up) * SAFETY > result.gpu_memory_gib
    assert roles.rollout.log_prob.micro_batch_size_per_gpu == min(2 * micro, roles.rollout.log_prob.sequences_per_gpu)


def test_a_whole_mini_batch_is_one_micro_batch_when_it_fits():
    result = tune(PRESETS / "ppo_critic_split.yaml", dynamic=False)
    roles = result.after.resolved.roles
    assert roles.actor.ppo_micro_batch_size_per_gpu == roles.actor.ppo_mini_batch_size_per_gpu


def test_a_smaller_gpu_gets_smaller_budgets_and_still_fits():
    big, small = tune(PRESETS / "grpo_7b_8gpu.yaml"), tune(PRESETS / "grpo_7b_8gpu.yaml", gpu_memory_gib=40)
    assert small.fits and small.gpu_source == "--gpu-memory"
    budget = lambda r: r.after.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu  # noqa: E731
    assert budget(small) < budget(big)
    assert peak(small.after) * SAFETY <= 40


def test_a_plan_that_cannot_fit_says_what_dominates_and_what_would_help():
    result = tune(PRESETS / "grpo_7b_8gpu.yaml", ["actor_rollout_ref.model.path=Qwen/Qwen2.5-72B-Instruct",
                                                  "trainer.n_gpus_per_node=1", "data.train_batch_size=8",
                                                  "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                                                  "actor_rollout_ref.rollout.tensor_model_parallel_size=1"], gpu_memory_gib=24)
    assert not result.fits
    assert "over the 20.9 GiB allowed" in result.why_not
    assert "largest term is" in result.why_not and "more GPUs" in result.why_not
    # The ladder was climbed before giving up: offload is on.
    assert result.after.config.actor_rollout_ref.actor.fsdp_config.param_offload


def test_memory_objective_takes_the_guides_floor():
    result = tune(PRESETS / "grpo_7b_8gpu.yaml", objective="memory")
    assert result.after.config.actor_rollout_ref.actor.ppo_max_token_len_per_gpu == 2 * (512 + 1024)


def test_the_written_plan_is_the_tuned_plan(tmp_path):
    result = tune(PRESETS / "ppo_critic_split.yaml", ["trainer.seed=7"])
    out = tmp_path / "tuned.yaml"
    out.write_text(tuned_plan_yaml(PRESETS / "ppo_critic_split.yaml", out, result, ["trainer.seed=7"]))
    written = compile_plan(out, [f"estimate.gpu_memory_gib={result.gpu_memory_gib:g}"])
    assert written.errors == [] and written.warnings == []
    assert written.resolved.roles == result.after.resolved.roles
    assert written.config.trainer.seed == 7


def test_cli_tune_prints_the_table_writes_the_plan_and_uses_the_stand_in_gpu(tmp_path, monkeypatch):
    from rlconf.device import LocalGpu

    monkeypatch.setattr("rlconf.device.local_gpu", lambda: LocalGpu("Stand-in GPU", 79.6))
    out = tmp_path / "tuned.yaml"
    # 80 columns, as a pipe gets them whatever the terminal the tests run in says.
    run = CliRunner().invoke(app, ["tune", str(PRESETS / "grpo_7b_8gpu.yaml"), "--write", str(out)],
                             env={"COLUMNS": "80"})
    assert run.exit_code == 0, run.output
    assert "GPU: 79.6 GiB (this machine's Stand-in GPU)" in run.output
    assert out.is_file() and f"wrote {out}" in run.output
    # A pipe gets rich's 80 columns: too few for the table, so each knob is a line of its own, nothing folded.
    result = tune(PRESETS / "grpo_7b_8gpu.yaml", [], 79.6)
    lines = run.output.splitlines()
    for change in result.changes:
        assert any(line.strip().startswith(f"{change.key}: ") and " → " in line for line in lines), change.key
    run = CliRunner().invoke(app, ["tune", str(PRESETS / "grpo_7b_8gpu.yaml"), "--gpu-memory", "40", "--format", "json"])
    payload = json.loads(run.stdout)
    assert payload["gpu_memory_gib"] == 40 and payload["fits"] and isinstance(payload["overrides"], list)
    assert max(p["total_gib"] for p in payload["after"]) * SAFETY <= 40


def test_the_knobs_table_keeps_keys_and_values_whole_where_it_fits_and_is_a_list_where_not():
    from rich.console import Console

    from rlconf.render_tune import tune_renderable
    from rlconf.tune import _yaml

    result = tune(PRESETS / "grpo_7b_8gpu.yaml", [], 79.6)
    assert result.changes
    for width in (80, 200):
        console = Console(width=width, record=True, color_system=None, file=open("/dev/null", "w"))
        console.print(tune_renderable(result, console.width))
        text = console.export_text()
        for change in result.changes:
            row = next(line for line in text.splitlines() if change.key in line)
            assert _yaml(change.after) in row, (width, row)  # the value beside its key, not folded
        header = any(line.split() == ["knob", "before", "after", "why"] for line in text.splitlines())
        assert header == (width == 200)  # the knobs table's header only where the table fits


def test_a_plan_only_host_offload_would_fit_is_refused_with_what_the_hosts_would_need():
    """7B on one 80 GiB GPU: Adam's moments alone are 56 GiB. FSDP2's offload_policy would fit the GPU, but its
    states go to host memory (16 B a parameter), which no plan describes: named with its cost, not chosen."""
    single = ["trainer.n_gpus_per_node=1", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
              "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]
    result = tune(PRESETS / "grpo_7b_8gpu.yaml", single, 79.6)
    assert not result.fits
    assert "offload_policy=true" in result.why_not
    assert "about 113 GiB of the actor's states in host memory" in result.why_not  # 16 B × 7.62B ÷ 2^30
    assert "actor_rollout_ref.actor.fsdp_config.offload_policy" not in result.after.config.model_dump_json() or \
        not result.after.config.actor_rollout_ref.actor.fsdp_config.offload_policy  # said, not set
    # On eight GPUs the same plan fits: no refusal, no hint.
    assert tune(PRESETS / "grpo_7b_8gpu.yaml", [], 79.6).fits


def test_cli_tune_exits_1_when_nothing_fits():
    run = CliRunner().invoke(app, ["tune", str(PRESETS / "grpo_7b_8gpu.yaml"), "actor_rollout_ref.model.path=Qwen/Qwen2.5-72B-Instruct",
                                   "trainer.n_gpus_per_node=1", "data.train_batch_size=8",
                                   "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
                                   "--gpu-memory", "24"])
    assert run.exit_code == 1
    assert "does not fit" in run.output
    assert "offload_policy" not in run.output  # 72B's rollout does not fit 24 GiB either way: no such hint


def test_a_rollout_pool_of_its_own_is_not_held_to_the_guides_share_for_a_shared_gpu():
    """RL602 and the tuner's 0.7 cap guard the actor's states beside vLLM; off-policy, the rollout's pool holds none."""
    from rlconf.compile import compile_plan

    gpu = ["trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm",
           "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "actor_rollout_ref.rollout.gpu_memory_utilization=0.85"]
    presets = Path(__file__).resolve().parents[2] / "presets"
    shared = compile_plan(presets / "quickstart.yaml", gpu)
    apart = compile_plan(presets / "quickstart_offpolicy.yaml", gpu)
    assert "RL602" in [d.code for d in shared.diagnostics]
    assert "RL602" not in [d.code for d in apart.diagnostics]


def test_in_flight_cap_is_the_smallest_cuda_graph_size_that_holds_a_replicas_sequences():
    from rlconf.tune import in_flight_cap

    # vLLM's graph sizes: 1, 2, 4, 8, then every multiple of 8
    assert [in_flight_cap(n) for n in (1, 2, 3, 5, 8, 9, 64, 65, 320)] == [1, 2, 4, 8, 8, 16, 64, 72, 320]


def test_max_num_seqs_comes_down_to_a_replicas_sequences_in_flight_and_never_below():
    gpu = ["trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm", "trainer.n_gpus_per_node=2",
           "actor_rollout_ref.rollout.tensor_model_parallel_size=1", "data.train_batch_size=16",
           "actor_rollout_ref.rollout.n=8", "actor_rollout_ref.actor.ppo_mini_batch_size=16"]
    result = tune(PRESETS / "quickstart.yaml", gpu, gpu_memory_gib=80)
    change = {c.key: c for c in result.changes}["actor_rollout_ref.rollout.max_num_seqs"]
    # 16 prompts × 8 samples over 2 replicas: 64 a replica, down from the default 256
    assert (change.before, change.after) == (256, 64) and "64 sequences in flight" in change.why
    assert result.after.config.actor_rollout_ref.rollout.max_num_seqs == 64
    # already at or below what a replica holds: left alone (vLLM would queue what does not fit)
    low = tune(PRESETS / "quickstart.yaml", gpu + ["actor_rollout_ref.rollout.max_num_seqs=48"], gpu_memory_gib=80)
    assert "actor_rollout_ref.rollout.max_num_seqs" not in {c.key for c in low.changes}
    # TP 2: one replica holds all 128
    tp2 = tune(PRESETS / "quickstart.yaml", [*gpu[:3], "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
                                             *gpu[4:]], gpu_memory_gib=80)
    assert {c.key: c.after for c in tp2.changes}["actor_rollout_ref.rollout.max_num_seqs"] == 128


def test_fully_async_keeps_its_max_num_seqs():
    # its calls stream into the pool, more than one round's share may be in flight
    gpu = ["trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm",
           "actor_rollout_ref.rollout.tensor_model_parallel_size=1"]
    result = tune(PRESETS / "quickstart_fullasync.yaml", gpu, gpu_memory_gib=80)
    assert result.before.resolved.schedule.mode == "fully_async"
    assert "actor_rollout_ref.rollout.max_num_seqs" not in {c.key for c in result.changes}


@pytest.mark.parametrize("threshold, sync_every", [(0.5, 2), (0.1, 1), (0.3, 1)])
def test_fully_async_on_vllm_gets_a_steps_share_in_the_engine_and_the_same_bound(threshold, sync_every):
    # the preset's window of 4 of a step's 16 groups (RL371). The bound counts groups, whatever the window:
    # 0.5 and 2 give ⌊16 × 1.5 × 2⌋ = 48 groups a version (staleness 2); 0.1 and 1 give ⌊17.6⌋ = 17 (1); 0.3 and 1
    # give ⌊20.8⌋ = 20 (1)
    gpu = ["trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm",
           "actor_rollout_ref.rollout.tensor_model_parallel_size=1",
           f"async_training.staleness_threshold={threshold}", f"async_training.trigger_parameter_sync_step={sync_every}"]
    result = tune(PRESETS / "quickstart_fullasync.yaml", gpu, gpu_memory_gib=80)
    changes = {c.key: c for c in result.changes}
    key = "async_training.concurrent_samples_per_replica"
    before, after = result.before.resolved.schedule, result.after.resolved.schedule
    assert (before.max_groups_per_version, before.max_staleness) == (after.max_groups_per_version, after.max_staleness)
    assert before.max_groups_per_version == int(16 * (1 + threshold) * sync_every)
    assert (changes[key].before, changes[key].after) == (4, 16) and "RL371" in changes[key].why
    assert after.replica_window == 16 and "RL371" not in {d.code for d in result.after.diagnostics}


def test_a_rollout_phase_over_the_gpu_does_not_hold_the_batches_at_the_guides_floor(tmp_path):
    # bench/tune.py's 3b_1gpu workload: 8 prompts × 8 samples of 16 + 512 tokens, mini batch 4 prompts (32 sequences
    # a GPU), one 79.2 GiB GPU. At verl's gpu_memory_utilization 0.5 the rollout phase alone is over the 68.9 GiB
    # allowed; that is vLLM's share to lower, not a reason to keep the training's token budget at 2 sequences.
    seq = 16 + 512
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "data: {train_files: 'synthetic://echo?size=64', max_prompt_length: 16, max_response_length: 512, "
        "train_batch_size: 8}\n"
        "actor_rollout_ref:\n  model: {path: 'random://Qwen2.5-3B', dtype: bfloat16}\n"
        "  actor: {ppo_mini_batch_size: 4, ppo_micro_batch_size_per_gpu: 4, use_kl_loss: false}\n"
        "  rollout: {name: vllm, n: 8, tensor_model_parallel_size: 1, log_prob_micro_batch_size_per_gpu: 8, "
        "gpu_memory_utilization: 0.5}\n"
        "algorithm: {adv_estimator: grpo}\ntrainer: {device: cuda, nnodes: 1, n_gpus_per_node: 1}\n")
    before = compile_plan(plan, ["estimate.gpu_memory_gib=79.2"])
    rollout_before = max(p.total_gib for p in before.resolved.memory if p.phase == "rollout")
    assert rollout_before * SAFETY > 79.2  # the case: the plan's rollout phase does not fit as written
    result = tune(plan, gpu_memory_gib=79.2)
    assert result.fits, result.why_not
    config = result.after.config.actor_rollout_ref
    # 32 sequences a GPU per mini batch: the whole mini batch in one micro batch fits the training phase.
    assert config.actor.ppo_max_token_len_per_gpu == 32 * seq
    assert config.rollout.gpu_memory_utilization < 0.5
    assert peak(result.after) * SAFETY <= 79.2


def test_a_served_reward_models_phase_does_not_hold_the_budget_at_one_sequence(tmp_path):
    # A colocated served reward model's phase holds its reservation and the actor's resident states: no budget
    # moves it. Offload makes room for it; the budget is then chosen again, as large as the training phase allows.
    plan = tmp_path / "plan.yaml"
    plan.write_text(
        "data: {train_files: 'synthetic://echo?size=64', max_prompt_length: 16, max_response_length: 512, "
        "train_batch_size: 16, return_raw_chat: true}\n"
        "actor_rollout_ref:\n  model: {path: 'random://Qwen2.5-1.5B', dtype: bfloat16}\n"
        "  actor: {ppo_mini_batch_size: 8, ppo_micro_batch_size_per_gpu: 4, use_kl_loss: false}\n"
        "  rollout: {name: vllm, n: 8, tensor_model_parallel_size: 1, log_prob_micro_batch_size_per_gpu: 8}\n"
        "reward_model: {enable: true, model: {path: 'tiny://qwen2-reward'}, "
        "rollout: {name: vllm, tensor_model_parallel_size: 1, gpu_memory_utilization: 0.75}}\n"
        "algorithm: {adv_estimator: grpo}\ntrainer: {device: cuda, nnodes: 1, n_gpus_per_node: 1}\n")
    result = tune(plan, gpu_memory_gib=79.6, costs=no_profile(tmp_path))
    assert result.fits, result.why_not
    phases = {p.phase: p.total_gib for p in result.after.resolved.memory}
    assert "reward" in phases
    actor = result.after.config.actor_rollout_ref
    assert actor.actor.fsdp_config.param_offload  # what made room for the reward phase
    assert actor.actor.ppo_max_token_len_per_gpu == 64 * 528  # the whole mini batch, not the ladder's one sequence


def test_vllms_share_holds_its_weights_and_a_kv_cache_whatever_the_throughput_model_prefers(tmp_path):
    """32B at tensor parallel 2: 30.5 GiB of weights a GPU. The 0.3 share a flat measured curve would pick holds
    24 GiB (RL611: vLLM would not start); the tuner takes the least share that holds them and a KV cache."""
    from rlconf.compile import compile_plan
    from rlconf.estimate import vllm_least_utilization, vllm_weights_gib
    from rlconf.modelinfo import model_info

    plan = ["actor_rollout_ref.model.path=Qwen/Qwen2.5-32B-Instruct", "actor_rollout_ref.rollout.tensor_model_parallel_size=2",
            "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]
    before = compile_plan(PRESETS / "grpo_7b_8gpu.yaml", plan + ["estimate.gpu_memory_gib=80"])
    assert "RL611" in {d.code for d in before.diagnostics}
    costs = tmp_path / "costs.json"
    costs.write_text(json.dumps({"schema_version": 1, "profiles": [{
        "device": "fixture", "model": "Qwen2.5-32B", "num_params_b": 32.8, "date": "2000-01-01", "command": "-",
        "commit": None, "terms": {"generate_s_per_ktoken": [[0.3, 1.0], [0.7, 1.0]]}}]}))
    result = tune(PRESETS / "grpo_7b_8gpu.yaml", plan, 80, costs=costs)
    utilization = result.after.config.actor_rollout_ref.rollout.gpu_memory_utilization
    weights = vllm_weights_gib("bfloat16", model_info("Qwen/Qwen2.5-32B-Instruct").num_params, 2)
    assert weights > 0.3 * 80
    assert utilization >= vllm_least_utilization(weights, 80) > 0.3
    assert "RL611" not in {d.code for d in result.after.diagnostics}
    # At tensor parallel 1 (61 GiB a GPU) no share within the guide's 0.7 holds them: offloaded (a fallback), the
    # share may go to 0.9, and does, as far as the weights need; nothing else (no Ulysses) is taken for it.
    single = tune(PRESETS / "grpo_7b_8gpu.yaml", plan[:1] + ["actor_rollout_ref.rollout.tensor_model_parallel_size=1"],
                  80, costs=costs)
    assert single.fits and "RL611" not in {d.code for d in single.after.diagnostics}
    actor = single.after.config.actor_rollout_ref
    assert actor.actor.fsdp_config.param_offload and actor.actor.ulysses_sequence_parallel_size == 1
    assert actor.rollout.gpu_memory_utilization >= vllm_least_utilization(2 * weights, 80) > 0.7


@pytest.mark.parametrize(("batch", "mini", "share"), [(64, 32, 0.3), (256, 64, 0.5), (1024, 256, 0.7)])
def test_vllms_share_stops_where_the_kv_cache_holds_the_round_twice(tmp_path, batch, mini, share):
    """grpo_7b_8gpu (Qwen2.5-7B, 4 kv heads of 128, 28 layers, bf16, tensor parallel 2: 7.10 GiB of weights and
    2 × 28 × 2 heads × 128 × 2 B = 28,672 B of KV cache a token a GPU; n 5, 4 replicas, 1,536-token sequences),
    80 GiB GPUs, no profile. A replica's round is batch × 5 ÷ 4 sequences:
    - 64: 80 × 1536 × 28,672 B = 3.28 GiB; (7.10 + 2 × 3.28) ÷ 80 + 0.05 = 0.22 → 0.25, under the least 0.3;
    - 256: 320 sequences, 13.1 GiB; (7.10 + 26.25) ÷ 80 + 0.05 = 0.467 → 0.5;
    - 1024 (the preset): 1,280 sequences, 52.5 GiB, twice that is over the GPU: the guide's raise, to 0.7."""
    overrides = [f"data.train_batch_size={batch}", f"actor_rollout_ref.actor.ppo_mini_batch_size={mini}",
                 f"critic.ppo_mini_batch_size={mini}"]
    result = tune(PRESETS / "grpo_7b_8gpu.yaml", overrides, 80, costs=no_profile(tmp_path))
    assert result.fits, result.why_not
    assert result.after.config.actor_rollout_ref.rollout.gpu_memory_utilization == share
    why = {c.key: c.why for c in result.changes}["actor_rollout_ref.rollout.gpu_memory_utilization"]
    if share < 0.7:
        assert f"a replica's round: {batch * 5 // 4} sequences" in why and "runs no more sequences" in why
    else:
        assert "RL602" in why


FREE_CACHE = "actor_rollout_ref.rollout.free_cache_engine"


def training_gib(result) -> float:
    return max(p.total_gib for p in result.resolved.memory if p.phase == "training")


def test_where_vllm_could_stay_awake_beside_training_the_tuner_says_so_and_keeps_the_sleep():
    """ppo_critic_split on 80 GiB: with every other knob as tuned, vLLM's share kept through training fits in the
    training phase's 69.6 GiB (the estimate counts it there: the phase grows by the kept reservation). The two
    launches that measured the lever disagree, so the plan keeps free_cache_engine true and the output says what
    would fit and what was measured."""
    from rlconf.tune import AWAKE_MEASURED

    result = tune(PRESETS / "ppo_critic_split.yaml")
    assert result.fits
    assert result.after.config.actor_rollout_ref.rollout.free_cache_engine is True
    assert FREE_CACHE not in [c.key for c in result.changes]
    awake = compile_plan(PRESETS / "ppo_critic_split.yaml", [*result.overrides, f"{FREE_CACHE}=false",
                                                             f"estimate.gpu_memory_gib={result.gpu_memory_gib:g}"])
    kept = [t for p in awake.resolved.memory if p.phase == "training" for t in p.terms
            if t.what == "vLLM reservation kept"]
    assert kept, "the awake engine's share is not in the training phase's estimate"
    assert training_gib(awake) == pytest.approx(training_gib(result.after) + kept[0].gib, abs=0.05)
    assert training_gib(awake) * SAFETY <= result.gpu_memory_gib
    considered = next(c for c in result.considered if c.key == FREE_CACHE)
    assert f"it fits ({training_gib(awake):.1f} GiB" in considered.why and AWAKE_MEASURED in considered.why


def test_vllm_sleeps_where_its_share_beside_training_would_not_fit_and_the_output_says_why():
    """grpo_7b_8gpu on 80 GiB: the tuned budgets and vLLM's 0.7 share together are over 69.6 GiB."""
    result = tune(PRESETS / "grpo_7b_8gpu.yaml")
    assert result.fits and result.after.config.actor_rollout_ref.rollout.free_cache_engine is True
    awake = compile_plan(PRESETS / "grpo_7b_8gpu.yaml", [*result.overrides, f"{FREE_CACHE}=false",
                                                         f"estimate.gpu_memory_gib={result.gpu_memory_gib:g}"])
    assert training_gib(awake) * SAFETY > result.gpu_memory_gib
    considered = next(c for c in result.considered if c.key == FREE_CACHE)
    assert (f"the training phase on pool `global` would need {training_gib(awake):.1f} GiB" in considered.why
            and "69.6 GiB allowed" in considered.why)


def served_reward_model_plan(folder: Path, share: float) -> Path:
    """0.5B GRPO on one GPU with a served reward model colocated (vLLM's pooling engine at `share`, asleep except
    while it scores), the actor's vLLM beside it."""
    path = folder / "served.yaml"
    path.write_text(
        "data: {train_files: 'synthetic://echo?size=64', max_prompt_length: 16, max_response_length: 512, "
        "train_batch_size: 16, return_raw_chat: true}\n"
        "actor_rollout_ref:\n  model: {path: 'random://Qwen2.5-0.5B', dtype: bfloat16}\n"
        "  actor: {ppo_mini_batch_size: 8, ppo_micro_batch_size_per_gpu: 4, use_kl_loss: false}\n"
        "  rollout: {name: vllm, n: 8, tensor_model_parallel_size: 1, log_prob_micro_batch_size_per_gpu: 8}\n"
        "reward_model: {enable: true, model: {path: 'tiny://qwen2-reward'}, "
        f"rollout: {{name: vllm, tensor_model_parallel_size: 1, gpu_memory_utilization: {share}}}}}\n"
        "algorithm: {adv_estimator: grpo}\ntrainer: {device: cuda, nnodes: 1, n_gpus_per_node: 1}\n")
    return path


def test_where_another_phase_is_what_would_not_fit_the_output_names_it(tmp_path):
    """With the actor's vLLM awake, the served reward model's phase (its 0.6 share beside it) is what goes over
    139.8 GiB ÷ 1.15: the output names that phase and its GiB, not the training phase's."""
    result = tune(served_reward_model_plan(tmp_path, 0.6), gpu_memory_gib=139.8)
    assert result.fits and result.after.config.actor_rollout_ref.rollout.free_cache_engine is True
    awake = compile_plan(tmp_path / "served.yaml", [*result.overrides, f"{FREE_CACHE}=false",
                                                    "estimate.gpu_memory_gib=139.8"])
    worst = max(awake.resolved.memory, key=lambda phase: phase.total_gib)
    assert worst.phase != "training" and worst.total_gib * SAFETY > 139.8
    why = next(c.why for c in result.considered if c.key == FREE_CACHE)
    assert f"the {worst.phase} phase on pool `{worst.pool}` would need {worst.total_gib:.1f} GiB" in why, why


def test_where_keeping_vllm_awake_is_refused_the_output_names_the_rule(tmp_path):
    """Two engines awake whose shares add up to over the GPU (0.75 + the actor's) is an error (RL544): the output
    names it instead of a memory figure."""
    result = tune(served_reward_model_plan(tmp_path, 0.75), gpu_memory_gib=79.6)
    assert result.fits and result.after.config.actor_rollout_ref.rollout.free_cache_engine is True
    why = next(c.why for c in result.considered if c.key == FREE_CACHE)
    assert why.endswith("it raises RL544"), why


def test_the_memory_objective_keeps_vllm_asleep_without_weighing_it():
    result = tune(PRESETS / "ppo_critic_split.yaml", objective="memory")
    assert result.fits and result.after.config.actor_rollout_ref.rollout.free_cache_engine is True
    assert FREE_CACHE not in [c.key for c in result.considered]


def test_a_rollout_pool_of_its_own_keeps_vllm_awake_and_the_tuned_plan_has_no_rl363():
    gpu = ["trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm",
           "actor_rollout_ref.rollout.tensor_model_parallel_size=1", f"{FREE_CACHE}=true"]
    before = compile_plan(PRESETS / "quickstart_offpolicy.yaml", gpu)
    assert "RL363" in [d.code for d in before.diagnostics]
    result = tune(PRESETS / "quickstart_offpolicy.yaml", gpu, gpu_memory_gib=80)
    assert result.fits, result.why_not
    assert result.after.config.actor_rollout_ref.rollout.free_cache_engine is False
    assert "RL363" not in [d.code for d in result.after.diagnostics]
    assert "pool of its own" in next(c.why for c in result.changes if c.key == FREE_CACHE)


def test_a_colocated_cpu_plan_keeps_its_free_cache_engine_without_weighing_it():
    result = tune(PRESETS / "quickstart.yaml", gpu_memory_gib=24)
    assert FREE_CACHE not in [c.key for c in result.changes] + [c.key for c in result.considered]


def test_a_cpu_rollout_pool_of_its_own_is_kept_awake_too_so_the_tuned_plan_has_no_rl363():
    """RL363 warns whatever the backend and device; the rollout pool's worker keeps its engine awake anyway."""
    before = compile_plan(PRESETS / "quickstart_offpolicy.yaml", [f"{FREE_CACHE}=true"])
    assert "RL363" in [d.code for d in before.diagnostics]
    result = tune(PRESETS / "quickstart_offpolicy.yaml", [f"{FREE_CACHE}=true"], gpu_memory_gib=24)
    assert result.fits, result.why_not
    assert result.after.config.actor_rollout_ref.rollout.free_cache_engine is False
    assert result.after.warnings == [], [d.message for d in result.after.warnings]
