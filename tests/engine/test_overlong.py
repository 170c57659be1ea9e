"""DAPO's overlong penalty (reward_manager dapo, reward_kwargs.overlong_buffer_cfg) by hand, and in a CPU step."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from engine.rewards.overlong import dapo_penalties, overlong_penalty  # noqa: E402
from launching import compile_preset, train_in_process  # noqa: E402

DAPO = ["reward_model.reward_manager=dapo", "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=true",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.len=2",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0",
        "+reward_model.reward_kwargs.overlong_buffer_cfg.log=true", "+reward_model.reward_kwargs.max_resp_len=4"]


def test_penalty_is_zero_before_the_buffer_and_falls_linearly_inside_it():
    # max_resp_len 8, buffer 4: expected length 8 - 4 = 4; penalty = min(-(L - 4) / 4 · 0.5, 0)
    got = overlong_penalty(torch.tensor([3, 4, 6, 8]), max_resp_len=8, buffer_len=4, penalty_factor=0.5)
    # L=3: +0.125 -> 0; L=4: 0; L=6: -2/4·0.5 = -0.25; L=8: -4/4·0.5 = -0.5
    assert got.tolist() == [0.0, 0.0, -0.25, -0.5]


def test_no_penalty_without_the_dapo_manager_or_with_the_buffer_off():
    lengths = torch.tensor([4])
    assert dapo_penalties(compile_preset("quickstart.yaml").config.reward_model, lengths) is None
    off = compile_preset("quickstart.yaml", [*DAPO[:1], "+reward_model.reward_kwargs.overlong_buffer_cfg.enable=false"])
    assert dapo_penalties(off.config.reward_model, lengths) is None
    on = compile_preset("quickstart.yaml", DAPO)
    assert dapo_penalties(on.config.reward_model, lengths).tolist() == [-1.0]  # -(4 - 2) / 2 · 1


def test_a_dapo_step_adds_each_responses_penalty_to_its_reward(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import engine.controller.stages
    import engine.rewards.managers

    seen = {}
    real = engine.controller.stages.compute_advantages

    def capture(algorithm, token_rewards, group_ids, batch, *rest):
        seen["rewards"], seen["lengths"] = token_rewards.sum(-1), batch["response_mask"].sum(-1)
        return real(algorithm, token_rewards, group_ids, batch, *rest)

    # Every answer scores 0, so a response's whole reward is its overlong penalty.
    monkeypatch.setattr(engine.rewards.managers, "score_responses", lambda fn, texts, *rest: [0.0] * len(texts))
    monkeypatch.setattr(engine.controller.stages, "compute_advantages", capture)
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("quickstart.yaml", ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=1", *DAPO])
    trainer = train_in_process(resolved, tmp_path / "run")
    # max_response_length 4, buffer 2: expected 2 tokens; penalty min(-(L - 2) / 2, 0): L=4 -> -1, L=3 -> -0.5
    expected = [min(-(length - 2) / 2, 0.0) for length in seen["lengths"].tolist()]
    assert seen["rewards"].tolist() == pytest.approx(expected)
    metrics = trainer.history[0]
    assert metrics["reward/overlong_reward/mean"] == pytest.approx(sum(expected) / len(expected))
    assert metrics["reward/overlong/fraction"] == pytest.approx(sum(e < 0 for e in expected) / len(expected))
    assert metrics["reward/mean"] == pytest.approx(sum(expected) / len(expected))
