"""ReMax on the CPU quickstart: each prompt's greedy response is generated and scored, and that score is
the baseline subtracted from its n samples' reward-to-go."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launching import capture_advantages, compile_preset, train_in_process  # noqa: E402


def test_remax_subtracts_each_prompts_greedy_score(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import engine.rewards.managers

    calls: list[list[str]] = []

    def score_by_length(fn, texts, *rest):
        calls.append(list(texts))
        return [float(len(text)) for text in texts]  # any score that differs between responses

    monkeypatch.setattr(engine.rewards.managers, "score_responses", score_by_length)
    seen = capture_advantages(monkeypatch)
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("quickstart.yaml", ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
                                                  "algorithm.adv_estimator=remax"])
    assert resolved.roles.critic is None
    train_in_process(resolved, tmp_path / "run")
    # one scoring of the 128 sampled responses, one of the 16 greedy ones (one per prompt)
    assert [len(texts) for texts in calls] == [128, 16]
    greedy_scores = torch.tensor([float(len(text)) for text in calls[1]])
    assert torch.equal(seen["baselines"], greedy_scores.repeat_interleave(8))  # each prompt's 8 samples share it
    mask = seen["batch"]["response_mask"].float()
    # outcome reward on the last token: reward-to-go is the score on every valid token
    expected = (seen["rewards"].sum(-1, keepdim=True) - seen["baselines"].unsqueeze(-1)) * mask
    assert torch.allclose(seen["advantages"], expected)
