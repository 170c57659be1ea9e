"""bench/verl_offpolicy.py on the CPU: both sides get the same overrides, rlconf's side compiles to scaling.py's
2gpu_offpolicy workload, and the tables compute the figures from each side's own step records."""

from __future__ import annotations

from pathlib import Path

import pytest
from bench_scripts import bench_module, fake_verl_site

from rlconf.compile import compile_plan
from rlconf.diagnostics import Severity

voff = bench_module("verl_offpolicy")
scaling = bench_module("scaling")
grpo_vs_trl = bench_module("grpo_vs_trl")

# What the side-by-side plan may change against scaling.py's own 2gpu_offpolicy run: the attention (padded, as verl
# must run), the data (parquet, not synthetic://) and its seeds, the reward (the same scores, from a file), the names,
# the memory estimate's GPU size (and so the estimate, the diagnostics and where the plan came from).
MAY_DIFFER = ("config.actor_rollout_ref.model.use_remove_padding", "config.actor_rollout_ref.model.override_config",
              "config.data.train_files", "config.data.val_files", "config.data.seed", "config.trainer.seed",
              "config.custom_reward_function", "config.trainer.project_name", "config.trainer.experiment_name",
              "config.estimate", "memory", "diagnostics", "source", "reward")


def _commands(tmp_path: Path, model: str) -> tuple[list[str], list[str], Path]:
    plan = tmp_path / "plan.yaml"
    plan.write_text("{}\n")
    shared = voff.shared_overrides(model, "/data", 5, voff.experiment_name(model))
    verl = voff.commands("verl", voff.side_overrides("verl", shared), plan, tmp_path / "run")
    rlconf = voff.commands("rlconf", voff.side_overrides("rlconf", shared), plan, tmp_path / "run")
    return verl, rlconf, plan


def _flat(value, prefix: str = "") -> dict:
    if isinstance(value, dict):
        return {k: v for key, item in value.items() for k, v in _flat(item, f"{prefix}.{key}" if prefix else key).items()}
    return {prefix: value}


@pytest.mark.parametrize("model", ["random://Qwen2.5-0.5B", "random://Qwen2.5-1.5B"])
def test_both_sides_get_the_same_overrides_and_rlconfs_compiles_to_one_step_off_policy(tmp_path, model):
    verl, rlconf, plan = _commands(tmp_path, model)
    assert verl[1:3] == ["-m", "verl.experimental.one_step_off_policy.main_ppo"]
    assert rlconf[1:5] == ["-m", "rlconf", "launch", str(plan)] and rlconf[-2:] == ["--run-dir", str(tmp_path / "run")]
    assert verl[3:] == rlconf[5:-2]  # the same dotted overrides, in the same order
    overrides = verl[3:]
    # verl's one-step main copies the top-level pool over actor_rollout_ref.rollout.*: the nested spelling would be lost
    assert {"rollout.nnodes=1", "rollout.n_gpus_per_node=1", "trainer.n_gpus_per_node=1"} <= set(overrides)
    assert not any(o.startswith("actor_rollout_ref.rollout.n_gpus_per_node") for o in overrides)

    result = compile_plan(plan, rlconf[5:-2])
    errors = [d for d in result.diagnostics if d.severity == Severity.ERROR]
    assert result.resolved is not None and not errors, [d.message for d in errors]
    # The one warning is packing being off, which verl's side needs (no flash-attn 2 on the device image).
    assert [d.code for d in result.diagnostics] == ["RL604"]
    resolved = result.resolved
    assert (resolved.schedule.mode, resolved.schedule.trainer_gpus, resolved.schedule.rollout_gpus,
            resolved.schedule.weight_sync) == ("one_step_off_policy", 1, 1, "nccl")
    rollout = resolved.roles.rollout
    assert (rollout.prompts_per_step, rollout.n, rollout.response_length, rollout.old_log_probs) == (16, 8, 512, "rollout")


def test_the_plan_is_scaling_py_2gpu_offpolicy_but_for_attention_data_and_reward(tmp_path):
    _, rlconf, plan = _commands(tmp_path, voff.MODEL)
    ours = compile_plan(plan, rlconf[5:-2]).resolved
    gpus, tp = scaling.CONFIGS["2gpu_offpolicy"]
    theirs = compile_plan(voff.ROOT / "presets" / "quickstart.yaml",
                          grpo_vs_trl.plan_overrides(voff.MODEL, 5)
                          + scaling.config_overrides("2gpu_offpolicy", gpus, tp, grpo_vs_trl.PROMPTS * gpus)).resolved
    a, b = _flat(ours.model_dump(mode="json")), _flat(theirs.model_dump(mode="json"))
    differ = sorted(k for k in set(a) | set(b) if a.get(k, "<absent>") != b.get(k, "<absent>"))
    assert differ  # the padded attention at least
    unexpected = [k for k in differ if not k.startswith(MAY_DIFFER)]
    assert not unexpected, {k: (a.get(k), b.get(k)) for k in unexpected}
    # the workload itself: batch, samples, lengths, micro batches, pools, vLLM's share and the update are the same
    assert ours.roles.model_dump() == theirs.roles.model_dump()
    assert ours.schedule.model_dump() == theirs.schedule.model_dump()


def test_packed_side_only_adds_packing(tmp_path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("{}\n")
    shared = voff.shared_overrides(voff.MODEL, "/data", 5, "x")
    packed = voff.side_overrides("rlconf_packed", shared)
    assert packed[:len(shared)] == shared and packed[len(shared):] == ["actor_rollout_ref.model.use_remove_padding=true"]
    resolved = compile_plan(plan, packed).resolved
    assert resolved.config.actor_rollout_ref.model.use_remove_padding is True


def _run(side: str, steps: list[dict]) -> dict:
    run = {"side": side, "steps": steps, "device_peak_used_gib_per_gpu": {0: 40.0, 1: 30.0}, "time_to_first_step_s": 99.0}
    run["summary"] = voff.summarize(run)
    return run


def test_tables_take_each_sides_own_timers_and_the_ratio_of_completion_tokens():
    # step 1 waits for the first batch (nothing overlaps yet): the figures are the medians of steps 2..N
    verl = _run("verl", [{"timing_s/step": 30.0, "timing_s/gen": 20.0, "timing_s/generate_async": 19.0,
                          "timing_s/sync_rollout_weights": 1.0, "timing_s/update_actor": 8.0}]
                + [{"timing_s/step": step, "timing_s/gen": 0.5, "timing_s/generate_async": 6.0,
                    "timing_s/sync_rollout_weights": 1.0, "timing_s/update_actor": 8.0,
                    "response_length/mean": 512.0} for step in (10.0, 12.0, 11.0)])
    rlconf = _run("rlconf", [{"timing/step": 9.0, "timing/wait_rollout": 6.0}]
                  + [{"timing/step": step, "timing/wait_rollout": 0.1, "timing/rollout_idle": 1.5,
                      "timing/rollout_generate": 2.5, "timing/weight_sync": 0.08, "timing/update_actor": 2.0,
                      "offpolicy/staleness": 1.0, "response_length/mean": 512.0} for step in (4.0, 3.0, 5.0)])
    sv, sr = verl["summary"], rlconf["summary"]
    assert (sv["step_s"], sr["step_s"]) == (11.0, 4.0)
    sampled = voff.BATCH * voff.SAMPLES * voff.RESPONSE_TOKENS
    assert sv["completion_tokens_per_s"] == pytest.approx(sampled / 11.0)
    assert sv["stages"]["trainer_idle"] == 0.5 and sr["stages"]["trainer_idle"] == 0.1
    # verl does not time its rollout pool's wait: step − generate − sync, marked as derived
    assert sv["rollout_idle_derived"] and sv["stages"]["rollout_idle"] == pytest.approx(11.0 - 6.0 - 1.0)
    assert not sr["rollout_idle_derived"] and sr["stages"]["rollout_idle"] == 1.5
    assert set(sv["timings"]) == {"timing_s/step", "timing_s/gen", "timing_s/generate_async",
                                  "timing_s/sync_rollout_weights", "timing_s/update_actor"}
    results = {"model": voff.MODEL, "runs": {"rlconf": rlconf, "verl": verl}}
    assert voff.ratio(results) == pytest.approx(11.0 / 4.0)
    text = voff.tables(results)
    assert "2.75×" in text and "≈4.00" in text and "| verl | `timing_s/generate_async` | 6.000 |" in text
    skipped = {"model": voff.MODEL, "runs": {"rlconf": rlconf, "verl": {"side": "verl", "skipped": "preflight failed"}}}
    assert voff.ratio(skipped) is None and "not run: preflight failed" in voff.tables(skipped)


def test_no_ratio_when_a_side_was_cut_off_after_its_first_step():
    # 2026-11-27: verl's 1.5B run reached step 1 (52 s, its start and compiles) at the budget's end; a ratio of
    # rlconf's steady steps to that first step (12.43×) says nothing about either trainer
    rlconf = _run("rlconf", [{"timing/step": 17.0}] + [{"timing/step": s} for s in (4.0, 4.2, 4.1)])
    verl = _run("verl", [{"timing_s/step": 52.3, "timing_s/gen": 46.1, "timing_s/update_actor": 5.9}])
    results = {"model": voff.MODEL, "runs": {"rlconf": rlconf, "verl": verl}}
    assert voff.ratio(results) is None
    assert "none (verl reached only step 1)" in voff.tables(results)
    verl = _run("verl", [{"timing_s/step": 52.3}, {"timing_s/step": 6.0}])
    assert voff.ratio({"runs": {"rlconf": rlconf, "verl": verl}}) == pytest.approx(6.0 / 4.1)
    assert "none (rlconf ran no step)" in voff.tables({"runs": {"rlconf": {"side": "rlconf"}, "verl": verl}})


def test_extra_overrides_reach_both_sides_last_and_validate(tmp_path):
    extra = ["actor_rollout_ref.actor.use_dynamic_bsz=true", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=34816"]
    shared = voff.shared_overrides(voff.MODEL, "/data", 5, "x", extra)
    assert shared[-2:] == extra and shared[:-2] == voff.shared_overrides(voff.MODEL, "/data", 5, "x")
    plan = tmp_path / "plan.yaml"
    plan.write_text("{}\n")
    verl = voff.commands("verl", voff.side_overrides("verl", shared), plan, tmp_path / "run")
    rlconf = voff.commands("rlconf", voff.side_overrides("rlconf", shared), plan, tmp_path / "run")
    assert verl[3:] == rlconf[5:-2] and verl[-2:] == extra
    resolved = compile_plan(plan, rlconf[5:-2]).resolved
    assert resolved.config.actor_rollout_ref.actor.use_dynamic_bsz is True


def test_the_learning_table_shows_each_sides_ppo_kl_and_reward_step_by_step():
    # verl prints its actor metrics as NumPy reprs: the parser must keep them, or a run like 2026-11-27's (verl's
    # ppo_kl 5.7 nats a token every step: its rollout did not sample the trained weights) goes unseen.
    line = ("(OneStepTaskRunner pid=5681) step:2 - training/global_step:2 - actor/pg_clipfrac:np.float64(0.1640625) "
            "- actor/ppo_kl:np.float64(5.699) - num_turns/min:np.int32(2) - critic/score/mean:0.41796875 - "
            "timing_s/step:15.76")
    step, values = bench_module("verl_side_by_side").parse_verl_line(line)
    assert step == 2
    assert values["actor/ppo_kl"] == 5.699 and values["actor/pg_clipfrac"] == 0.1640625
    assert values["num_turns/min"] == 2.0 and values["critic/score/mean"] == 0.41796875
    verl = _run("verl", [values, {**values, "actor/ppo_kl": 5.69}])
    rlconf = _run("rlconf", [{"timing/step": 4.0, "actor/ppo_kl": 3e-5, "actor/pg_clipfrac": 0.0, "reward/mean": 0.0,
                              "rollout/log_prob_diff_mean": 0.0092}] * 2)
    assert verl["summary"]["learning"]["ppo_kl"] == [5.699, 5.69]
    assert verl["summary"]["learning"]["log-prob gap"] == [None, None]
    text = voff.tables({"model": voff.MODEL, "runs": {"rlconf": rlconf, "verl": verl}})
    assert "| verl | ppo_kl | 5.7 5.69 |" in text and "| rlconf | ppo_kl | 3e-05 3e-05 |" in text
    assert "| verl | reward mean | 0.418 0.418 |" in text
    assert "| verl | log-prob gap |" not in text  # reported by no step: left out
    assert "| rlconf | log-prob gap | 0.0092 0.0092 |" in text


# Stands in for verl's one-step main_ppo: says whether the recipe's relative config folder is there, prints verl's
# console step lines (behind Ray's prefix), then waits, as verl's shutdown might, until it is killed.
FAKE_VERL_MAIN = """
import os, time
print("config folder here:", os.path.isdir("verl/trainer/config") and not os.path.exists("verl/__init__.py"), flush=True)
for step in (1, 2, 3):
    print(f"(TaskRunner pid=1) step:{step} - timing_s/gen:{4 - step}.5 - timing_s/step:{10 + step}.0 - "
          f"timing_s/agent_loop/generate_sequences/mean:2.0", flush=True)
time.sleep(600)
"""


def test_verls_run_is_killed_once_its_last_step_is_printed_and_starts_where_its_config_search_path_points(
        tmp_path, monkeypatch):
    sbs = bench_module("verl_side_by_side")
    monkeypatch.setattr(sbs, "cache_sizes", lambda: {})
    site, out = fake_verl_site(tmp_path, FAKE_VERL_MAIN)
    run = sbs.run_side("verl", ["trainer.total_training_steps=3"], out, "verl", 120, str(site),
                       entry=("verl.fake_main", "", ""), stop_after_steps=3)
    assert run["stopped_after_last_step"] and not run["timed_out"] and run["wall_s"] < 60
    assert [s["timing_s/step"] for s in run["steps"]] == [11.0, 12.0, 13.0]
    assert run["steps"][0]["timing_s/agent_loop/generate_sequences/mean"] == 2.0
    assert "config folder here: True" in (out / "verl.log").read_text()
    assert "log_tail" not in run  # killed after its last step: not a failure
