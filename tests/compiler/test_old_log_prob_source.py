"""Where π_old comes from (rlconf.normalize.old_log_prob_source), as `rlconf explain` states it."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlconf.compile import compile_plan

PRESETS = Path(__file__).resolve().parents[2] / "presets"
ONE_GPU = ["trainer.n_gpus_per_node=1", "data.train_batch_size=8", "actor_rollout_ref.actor.ppo_mini_batch_size=8"]


def _rollout(preset: str, *overrides: str):
    result = compile_plan(PRESETS / preset, [*ONE_GPU, *overrides])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved.roles.rollout


@pytest.mark.parametrize("overrides, source, because", [
    ((), "update", "1 optimizer step"),
    (("actor_rollout_ref.actor.ppo_epochs=2",), "recompute", "ppo_epochs 2 × 1 mini batches = 2"),
    (("actor_rollout_ref.actor.ppo_mini_batch_size=4",), "recompute", "ppo_epochs 1 × 2 mini batches = 2"),
    (("algorithm.use_kl_in_reward=true", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8"), "recompute",
     "algorithm.use_kl_in_reward"),
    (("algorithm.rollout_correction.bypass_mode=true",), "rollout", "bypass_mode"),
    # bypass mode takes π_rollout whatever the update's shape
    (("algorithm.rollout_correction.bypass_mode=true", "actor_rollout_ref.actor.ppo_epochs=2"), "rollout", "bypass"),
    # rejection rewrites the mask before advantages, batch normalization takes one mean over the whole batch
    (("algorithm.rollout_correction.rollout_rs=seq_mean_k1", "algorithm.rollout_correction.rollout_rs_threshold=0.999_1.001"),
     "recompute", "rollout_correction.rollout_rs"),
    (("algorithm.rollout_correction.rollout_is=token", "algorithm.rollout_correction.rollout_is_batch_normalize=true"),
     "recompute", "rollout_is_batch_normalize"),
    (("algorithm.rollout_correction.rollout_is=token",), "update", "1 optimizer step"),
    # in bypass mode both act per micro batch inside the loss (verl's bypass loss): still no pass
    (("algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.rollout_rs=token_k2",
      "algorithm.rollout_correction.rollout_rs_threshold=0.01"), "rollout", "bypass_mode"),
])
def test_grpo_quickstart_sources(overrides, source, because) -> None:
    rollout = _rollout("quickstart.yaml", *overrides)
    assert rollout.old_log_probs == source
    assert because in rollout.old_log_probs_why


def test_a_critic_warmup_keeps_the_pass_since_its_steps_update_no_actor() -> None:
    rollout = _rollout("quickstart_ppo.yaml", "trainer.critic_warmup=1")
    assert rollout.old_log_probs == "recompute" and "critic_warmup 1" in rollout.old_log_probs_why
    assert _rollout("quickstart_ppo.yaml").old_log_probs == "update"


def test_explain_says_so_instead_of_a_table_of_a_pass_that_does_not_run() -> None:
    from rich.console import Console

    from rlconf.render import explain_renderable

    result = compile_plan(PRESETS / "quickstart.yaml", ONE_GPU)
    console = Console(width=200, record=True)
    console.print(explain_renderable(result.resolved))
    text = console.export_text()
    assert "old log-probs: from the update's own forward, no separate pass" in text
    assert "old log-probs (actor model, forward only)" not in text


def test_the_optimal_token_baselines_keep_the_pass_that_gives_their_sum_pi_squared() -> None:
    rollout = _rollout("quickstart.yaml", "algorithm.adv_estimator=optimal_token_baseline")
    assert rollout.old_log_probs == "recompute" and "adv_estimator optimal_token_baseline" in rollout.old_log_probs_why


OFF = "actor_rollout_ref.rollout.calculate_log_probs=false"


@pytest.mark.parametrize("overrides, returned, because", [
    ((), True, "calculate_log_probs true"),  # verl's rollout.yaml default
    ((OFF,), False, "calculate_log_probs false and nothing else"),
    # where the algorithm reads them, false does not turn them off (verl would ask the user to)
    ((OFF, "algorithm.rollout_correction.bypass_mode=true"), True, "bypass_mode"),
    ((OFF, "algorithm.rollout_correction.rollout_is=token"), True, "rollout_correction.rollout_is read"),
    ((OFF, "algorithm.rollout_correction.rollout_rs=seq_mean_k1",
      "algorithm.rollout_correction.rollout_rs_threshold=0.999_1.001"), True, "rollout_correction.rollout_rs read"),
    # π_old recomputed or not, nothing else reads the engine's log-probs
    ((OFF, "actor_rollout_ref.actor.ppo_epochs=2"), False, "nothing else"),
])
def test_the_rollout_returns_log_probs_where_asked_or_read(overrides, returned, because) -> None:
    rollout = _rollout("quickstart.yaml", *overrides)
    assert rollout.log_probs is returned
    assert because in rollout.log_probs_why


@pytest.mark.parametrize("preset, overrides, says", [
    ("quickstart.yaml", (OFF, "algorithm.rollout_correction.rollout_is=token"), "skips the correction"),
    ("quickstart.yaml", (OFF, "algorithm.rollout_correction.bypass_mode=true"), "bypass mode raises"),
    ("quickstart_fullasync.yaml", (OFF,), "a fully async run asserts it"),  # the preset's bypass mode reads them
    ("quickstart_fullasync.yaml", (OFF, "algorithm.rollout_correction.bypass_mode=false"), "samples without"),
    ("quickstart.yaml", (OFF,), None),  # nothing reads them, verl runs it the same: nothing to say
    ("quickstart.yaml", ("algorithm.rollout_correction.rollout_is=token",), None),  # true, as verl's default
])
def test_rl553_says_what_verl_would_do_with_calculate_log_probs_false(preset, overrides, says) -> None:
    result = compile_plan(PRESETS / preset, [*ONE_GPU, *overrides] if preset == "quickstart.yaml" else list(overrides))
    found = [d for d in result.diagnostics if d.code == "RL553"]
    if says is None:
        assert not found
    else:
        assert len(found) == 1 and found[0].severity == "warning" and says in found[0].message, found
        assert found[0].key == "actor_rollout_ref.rollout.calculate_log_probs"
