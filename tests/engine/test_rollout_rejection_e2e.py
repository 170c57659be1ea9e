"""End to end on CPU: rollout correction's rejection sampling (rollout_rs) in a run that trains.

The quickstart's HF generate (fp32, the trainer's weights) differs from the trainer's log-probs by rounding
only (|Δ log p| ≤ 1e-6, measured 2026-11-26): whole fp32 ulps of log-probs of a few nats, 4.8e-7 each. The
learning run bounds the ratio to 1 ± 5e-7, which rejects the tokens two or more ulps off (0.2-4% a step with
transformers 5.24, 2026-11-27). 1 ± 3e-7 rejected every token one ulp off, 29-42% a step with transformers
5.24, and the 40-step run then learned to 0.092, short of the criterion's 0.1 (it had passed with the
transformers of the days before). With a bf16 HF rollout (mean |Δ log p| about 8e-4, the kind of gap vLLM's bf16 kernels make)
and token_k1 0.999_1.001, verl's Geo-RS default bounds, the 40-step quickstart went from a mean reward of
0.011 (first 5 steps) to 0.062 (last 5): learning, but short of the quickstart's criterion (≥ 0.1); the
bypass-mode tests below use that rollout, where rejections are not rounding noise.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from launching import assert_learns, compile_preset, launch_preset, read_metrics, train_in_process

BF16_ROLLOUT = "actor_rollout_ref.rollout.dtype=bfloat16"
RC = "algorithm.rollout_correction"


@pytest.mark.slow
def test_quickstart_with_token_rejection_learns_and_rejects_part_of_the_tokens(tmp_path_factory, ray_address) -> None:
    resolved, run_dir, code = launch_preset(tmp_path_factory, "rs", "quickstart.yaml", [
        f"{RC}.rollout_rs=token_k1", f"{RC}.rollout_rs_threshold=0.9999995_1.0000005"], address=ray_address)
    assert code == 0 and resolved.roles.rollout.old_log_probs == "recompute"
    metrics = read_metrics(run_dir)
    assert len(metrics) == resolved.config.trainer.total_training_steps
    rejected = [m["rollout_corr/rollout_rs_masked_fraction"] for m in metrics]
    # Part of the tokens: never all of a step's, some in most steps (a step may have no token two ulps off).
    assert all(fraction < 1.0 for fraction in rejected) and sum(f > 0 for f in rejected) >= len(rejected) // 2, rejected
    assert_learns(metrics)


def test_verl_multi_rs_example_settings_run_in_bypass_mode(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """verl's run_with_rollout_corr_multi_rs.sh (bypass, ppo_clip, token IS, token_k1 + seq_max_k2) and
    run_with_rollout_corr.sh (bypass, reinforce, sequence IS batch-normalized), on the quickstart for 2 steps."""
    pytest.importorskip("transformers")
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    small = ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=2", BF16_ROLLOUT, f"{RC}.bypass_mode=true"]
    multi_rs = compile_preset("quickstart.yaml", [*small, f"{RC}.rollout_is=token", f"{RC}.loss_type=ppo_clip",
                                                  f"{RC}.rollout_rs=token_k1,seq_max_k2",
                                                  f"{RC}.rollout_rs_threshold=0.999_1.001,2.5"])
    for m in train_in_process(multi_rs, tmp_path / "multi_rs").history:
        assert 0.0 < m["rollout_corr/rollout_rs_token_k1_masked_fraction"] < 1.0
        assert m["rollout_corr/rollout_rs_seq_max_k2_masked_fraction"] == 0.0  # (Δ log p)²/2 is far below 2.5
        assert math.isfinite(m["actor/pg_loss"]) and "actor/rollout_corr/rollout_rs_masked_fraction" not in m
    rloo = compile_preset("quickstart.yaml", [*small, "algorithm.adv_estimator=rloo", f"{RC}.rollout_is=sequence",
                                              f"{RC}.rollout_is_batch_normalize=true", f"{RC}.loss_type=reinforce"])
    for m in train_in_process(rloo, tmp_path / "rloo").history:
        # the weights' mean over the micro batch before normalization: near 1, not exactly (bf16 sampling)
        assert m["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1.0, abs=0.05)
        assert m["rollout_corr/rollout_is_batch_norm_factor"] != 1.0
        assert math.isfinite(m["actor/pg_loss"])
