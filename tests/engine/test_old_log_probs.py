"""π_old without a separate pass: from the update's own forward (one optimizer step) or, in verl's bypass
mode, from the rollout engine; the policy-loss inputs each source gives, and the metrics the update
then measures (engine.algos.rollout_correction.policy_loss_inputs, engine.workers.passes.first_pass)."""

from __future__ import annotations

import math
from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")

QUICKSTART = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"
LOG_PROBS = [[-1.0, -2.0]]
ROLLOUT = [[-1.5, -1.0]]
ADVANTAGES = torch.tensor([[1.0, -2.0]])
MASK = torch.tensor([[1, 1]])


def _correction(rollout_is=None, loss_type="ppo_clip", threshold=2.0):
    return SimpleNamespace(rollout_is=rollout_is, rollout_is_threshold=threshold, loss_type=loss_type)


def _loss(source: str, correction, loss_mode="vanilla", **given):
    from engine.algos.policy_losses import LossSettings, compute_policy_loss
    from engine.algos.rollout_correction import policy_loss_inputs

    log_probs = torch.tensor(LOG_PROBS, requires_grad=True)
    mode, old, weights = policy_loss_inputs(source, loss_mode, correction, log_probs, MASK,
                                            rollout_log_probs=torch.tensor(ROLLOUT), **given)
    out = compute_policy_loss(mode, old, log_probs, ADVANTAGES, MASK, LossSettings(), "token-mean", is_weights=weights)
    out.loss.backward()
    return mode, old, weights, out, log_probs.grad


def test_from_the_update_pi_old_is_the_detached_forward_and_the_weights_follow_from_it() -> None:
    mode, old, weights, out, grad = _loss("update", _correction("token"))
    assert mode == "vanilla" and not old.requires_grad and old.tolist() == LOG_PROBS
    w = [math.exp(0.5), math.exp(-1.0)]  # π_old / π_rollout per token, both under the threshold 2
    assert weights[0].tolist() == pytest.approx(w)
    # ratio 1: each token's loss is -A·w, averaged over the 2 tokens; its gradient in log π is the same.
    assert float(out.loss.detach()) == pytest.approx((-1.0 * w[0] + 2.0 * w[1]) / 2)
    assert grad[0].tolist() == pytest.approx([-1.0 * w[0] / 2, 2.0 * w[1] / 2])
    assert float(out.clip_fraction) == 0.0


def test_bypass_ppo_clip_takes_the_ratio_against_the_rollout_policy_without_weights() -> None:
    mode, old, weights, out, _ = _loss("rollout", _correction("token"), loss_mode="gspo")
    assert mode == "vanilla" and old.tolist() == ROLLOUT and weights is None  # gspo replaced, as verl does
    # ratios e^0.5 = 1.65 (A=1: clipped to 1.2) and e^-1 = 0.37 (A=-2: the clipped 0.8 gives the larger loss 1.6)
    assert float(out.loss.detach()) == pytest.approx((-1.2 + 1.6) / 2)
    assert float(out.clip_fraction) == 1.0


def test_bypass_reinforce_weights_minus_a_log_pi_by_the_truncated_sequence_ratio() -> None:
    mode, old, weights, out, grad = _loss("rollout", _correction("sequence", loss_type="reinforce"))
    w = math.exp(0.5 - 1.0)  # the product of the row's token ratios
    assert mode == "gpg" and weights[0].tolist() == pytest.approx([w, w])
    assert float(out.loss.detach()) == pytest.approx((-1.0 * -1.0 * w + 2.0 * -2.0 * w) / 2)
    assert grad[0].tolist() == pytest.approx([-1.0 * w / 2, 2.0 * w / 2])
    # truncated: a threshold below the ratio caps it
    _, _, capped, _, _ = _loss("rollout", _correction("sequence", loss_type="reinforce", threshold=0.5))
    assert capped.tolist() == [[0.5, 0.5]]


def test_recomputed_inputs_pass_through_and_a_missing_rollout_log_prob_is_named() -> None:
    from engine.algos.rollout_correction import policy_loss_inputs

    old, weights = torch.tensor([[-0.5, -0.5]]), torch.tensor([[1.0, 0.5]])
    mode, got_old, got_weights = policy_loss_inputs("recompute", "gspo", _correction(), torch.tensor(LOG_PROBS), MASK,
                                                    old_log_probs=old, is_weights=weights)
    assert mode == "gspo" and got_old is old and got_weights is weights
    with pytest.raises(ValueError, match="returned no log-probs"):
        policy_loss_inputs("rollout", "vanilla", _correction(), torch.tensor(LOG_PROBS), MASK)


def test_first_pass_metrics_count_each_valid_token_once() -> None:
    from engine.workers.passes.first_pass import FirstPassMetrics

    metrics = FirstPassMetrics(rows=3, is_threshold=2.0)
    # two micro batches cut to different response widths (2 and 3 columns); padding must not count
    metrics.add(torch.tensor([[1, 0], [1, 1]]), torch.tensor([[-1.0, 9.0], [-2.0, -3.0]]),
                torch.tensor([[0.5, 9.0], [1.0, 1.5]]), torch.tensor([[-1.5, 9.0], [-2.0, -2.0]]),
                torch.tensor([[2.0, 9.0], [1.0, 0.5]]))
    metrics.add(torch.tensor([[1, 1, 1]]), torch.tensor([[-1.0, -1.0, -1.0]]), torch.tensor([[2.0, 2.0, 2.0]]),
                torch.tensor([[-1.0, -1.0, -4.0]]), torch.tensor([[1.0, 1.0, 2.0]]))
    # a later epoch over the same rows is not measured again
    metrics.add(torch.tensor([[1, 1]]), torch.tensor([[-50.0, -50.0]]), torch.tensor([[50.0, 50.0]]),
                torch.tensor([[0.0, 0.0]]), torch.tensor([[2.0, 2.0]]))
    got = metrics.metrics()
    assert got["actor/entropy"] == pytest.approx((0.5 + 1.0 + 1.5 + 6.0) / 6)
    assert got["rollout/log_prob_diff_mean"] == pytest.approx((0.5 + 0 + 1.0 + 0 + 0 + 3.0) / 6)
    assert got["rollout/log_prob_diff_max"] == pytest.approx(3.0)
    assert got["rollout/is_weight_mean"] == pytest.approx((2.0 + 1.0 + 0.5 + 1.0 + 1.0 + 2.0) / 6)
    assert got["rollout/is_truncated_fraction"] == pytest.approx(2 / 6)


@pytest.mark.parametrize("knobs", [[], ["actor_rollout_ref.model.use_fused_kernels=true"]], ids=["plain", "fused"])
def test_one_optimizer_step_trains_alike_without_the_old_log_prob_pass(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch, knobs) -> None:
    """The quickstart (one optimizer step a training step) in process, π_old from the update against the
    same plan with the separate pass: the same losses, gradients and sampling entropy, one pass less."""
    pytest.importorskip("transformers")
    from launching import train_in_process
    from rows import recomputing_old_log_probs

    from rlconf.compile import compile_plan

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    result = compile_plan(QUICKSTART, ["trainer.n_gpus_per_node=1", "data.train_batch_size=4",
                                       "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.total_training_steps=2",
                                       "actor_rollout_ref.actor.entropy_coeff=0", *knobs])
    resolved = result.resolved
    assert resolved is not None and resolved.roles.rollout.old_log_probs == "update"
    skipped = train_in_process(resolved, tmp_path / "update").history
    recomputed = train_in_process(recomputing_old_log_probs(resolved), tmp_path / "recompute").history
    for fast, slow in zip(skipped, recomputed, strict=True):
        assert "timing/old_log_prob" in slow and "timing/old_log_prob" not in fast
        assert fast["reward/mean"] == slow["reward/mean"]  # the same samples
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert fast[key] == pytest.approx(slow[key], rel=1e-4, abs=1e-6), key
        assert fast["actor/pg_clipfrac"] == 0.0  # the ratio is exactly 1


def test_without_the_rollouts_log_probs_it_trains_alike_and_only_the_gap_metric_goes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """rollout.calculate_log_probs false with nothing reading them: the same samples and losses as with them;
    the rollout/trainer gap, which reads them, is not measured."""
    pytest.importorskip("transformers")
    from launching import train_in_process

    from rlconf.compile import compile_plan

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    runs = {}
    for returned, extra in ((True, []), (False, ["actor_rollout_ref.rollout.calculate_log_probs=false"])):
        resolved = compile_plan(QUICKSTART, ["trainer.n_gpus_per_node=1", "data.train_batch_size=4",
                                             "actor_rollout_ref.actor.ppo_mini_batch_size=4",
                                             "trainer.total_training_steps=2", *extra]).resolved
        assert resolved is not None and resolved.roles.rollout.log_probs is returned
        runs[returned] = train_in_process(resolved, tmp_path / str(returned)).history
    for with_them, without in zip(runs[True], runs[False], strict=True):
        assert "rollout/log_prob_diff_mean" in with_them and "rollout/log_prob_diff_mean" not in without
        assert without["reward/mean"] == with_them["reward/mean"]  # the same samples
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert without[key] == pytest.approx(with_them[key], rel=1e-5, abs=1e-7), key


@pytest.mark.parametrize("overrides, source", [
    (["algorithm.rollout_correction.bypass_mode=true", "algorithm.rollout_correction.loss_type=reinforce",
      "algorithm.rollout_correction.rollout_is=token"], "rollout"),
    (["algorithm.rollout_correction.rollout_is=sequence", "actor_rollout_ref.actor.ppo_epochs=2"], "recompute"),
    (["algorithm.rollout_correction.rollout_is=token"], "update"),
    # returned although the plan says false: rollout_is reads them
    (["algorithm.rollout_correction.rollout_is=token", "actor_rollout_ref.rollout.calculate_log_probs=false"], "update"),
])
def test_rollout_correction_runs_on_cpu_with_hf_generates_log_probs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                    overrides, source) -> None:
    """HF generate's log-probs (fp32, the same weights) are the trainer's up to rounding: the gap is ~0
    and the IS weights ~1, whichever source π_old has."""
    pytest.importorskip("transformers")
    from launching import train_in_process

    from engine.capabilities import unsupported_features
    from rlconf.compile import compile_plan

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    result = compile_plan(QUICKSTART, ["trainer.n_gpus_per_node=1", "data.train_batch_size=4",
                                       "actor_rollout_ref.actor.ppo_mini_batch_size=4", "trainer.total_training_steps=2",
                                       *overrides])
    resolved = result.resolved
    assert resolved is not None and resolved.roles.rollout.old_log_probs == source
    assert unsupported_features(resolved) == []
    history = train_in_process(resolved, tmp_path / "run").history
    assert len(history) == 2
    for m in history:
        assert ("timing/old_log_prob" in m) == (source == "recompute")
        assert m["rollout/log_prob_diff_max"] < 1e-4
        assert m["rollout/is_weight_mean"] == pytest.approx(1.0, abs=1e-4)
        assert math.isfinite(m["actor/pg_loss"]) and "actor/entropy" in m


def test_bypass_mode_with_an_optimal_token_baseline_is_refused_before_launch() -> None:
    from engine.capabilities import unsupported_features
    from rlconf.compile import compile_plan

    result = compile_plan(QUICKSTART, ["algorithm.adv_estimator=tir_optimal_token_baseline",
                                       "algorithm.rollout_correction.bypass_mode=true"])
    assert result.resolved is not None
    assert any("Σπ² from the old-log-prob pass, which bypass mode" in p for p in unsupported_features(result.resolved))
