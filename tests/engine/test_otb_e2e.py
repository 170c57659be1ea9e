"""The optimal token baseline on the CPU quickstart: the actor's log-prob pass also returns Σπ² at every
response token, and the advantages are the OTB of those inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launching import capture_advantages, compile_preset, train_in_process  # noqa: E402


def test_otb_trains_on_sum_pi_squared_from_the_actors_log_prob_pass(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import engine.rewards.managers
    from engine.algos.advantages import compute_optimal_token_baseline_advantages


    def score_by_length(fn, texts, *rest):
        return [float(len(text) % 3) for text in texts]  # scores that differ within a group

    monkeypatch.setattr(engine.rewards.managers, "score_responses", score_by_length)
    seen = capture_advantages(monkeypatch)
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("quickstart.yaml", ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
                                                  "algorithm.adv_estimator=optimal_token_baseline"])
    train_in_process(resolved, tmp_path / "run")
    batch = seen["batch"]
    mask = batch["response_mask"].bool()
    pi = batch["old_log_probs"].exp()[mask]
    sum_pi_squared = batch["sum_pi_squared"][mask]
    # Σπ² of the distribution the sampled token's π comes from: at least π² (that token's own term) and at
    # most π² + (1 - π)² (the rest of the mass on one token). A Σπ² from other logits or another
    # temperature would leave this band.
    assert torch.all(sum_pi_squared >= pi**2 - 1e-5)
    assert torch.all(sum_pi_squared <= pi**2 + (1 - pi) ** 2 + 1e-5)
    expected, _ = compute_optimal_token_baseline_advantages(seen["rewards"], batch["response_mask"], seen["groups"],
                                                            batch["old_log_probs"], batch["sum_pi_squared"])
    assert torch.allclose(seen["advantages"], expected)
    # A per-token baseline: within a response the advantage varies along the tokens (GRPO's would not).
    varies = [(row[m].max() - row[m].min()) > 1e-6 for row, m in zip(seen["advantages"], mask, strict=True) if m.any()]
    assert any(varies)
