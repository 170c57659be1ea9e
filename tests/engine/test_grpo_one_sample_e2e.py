"""GRPO with rollout.n 1 on the CPU quickstart trains as verl runs it (issue #30): every prompt's group is its one
response, whose mean is taken as 0 and std as 1, so the advantage is the raw reward on every response token."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launching import capture_advantages, compile_preset, train_in_process  # noqa: E402


def test_grpo_with_one_sample_per_prompt_trains_on_the_raw_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import engine.rewards.managers

    def score_by_length(fn, texts, *rest):
        return [float(len(text)) for text in texts]  # rewards that differ between responses, none of them 0

    monkeypatch.setattr(engine.rewards.managers, "score_responses", score_by_length)
    seen = capture_advantages(monkeypatch)
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("quickstart.yaml", ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
                                                  "actor_rollout_ref.rollout.n=1"])
    trainer = train_in_process(resolved, tmp_path / "run")
    assert [metrics["step"] for metrics in trainer.history] == [1, 2]
    assert len(set(seen["groups"])) == len(seen["groups"]) == 16  # 16 prompts, one response each
    mask = seen["batch"]["response_mask"].to(seen["advantages"].dtype)
    # outcome reward on the last token; a group of one: (reward - 0) / (1 + 1e-6), as verl's GRPO
    expected = seen["rewards"].sum(-1, keepdim=True) / (1.0 + 1e-6) * mask
    assert torch.allclose(seen["advantages"], expected, rtol=0, atol=1e-6)
    assert seen["advantages"].abs().sum() > 0
