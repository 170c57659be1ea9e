"""DAPO dynamic sampling on the CPU quickstart: groups whose responses all score the same are dropped,
more prompts are generated, and the trained batch is still train_batch_size × n rows."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launching import compile_preset, read_metrics, train_in_process  # noqa: E402


def test_filter_groups_drops_uniform_groups_and_trains_a_full_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import engine.trainer

    trained_rows: list[int] = []
    real = engine.trainer.compute_advantages

    def score(fn, texts, sources, truths, extras):
        # Prompts whose answer has an even length score 0 whatever the response (a uniform group, to be
        # dropped); the others score by response length mod 3, which differs within a group.
        return [0.0 if len(truth) % 2 == 0 else float(len(text) % 3) for text, truth in zip(texts, truths)]

    def capture(algorithm, token_rewards, group_ids, batch, reward_baselines=None):
        trained_rows.append(token_rewards.shape[0])
        assert len(set(group_ids)) == 16  # exactly train_batch_size groups, numbered apart
        return real(algorithm, token_rewards, group_ids, batch, reward_baselines)

    monkeypatch.setattr(engine.trainer, "score_responses", score)
    monkeypatch.setattr(engine.trainer, "compute_advantages", capture)
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("quickstart.yaml", ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
                                                  "algorithm.filter_groups.enable=true",
                                                  "algorithm.filter_groups.metric=score"])
    assert resolved.config.data.train_batch_size == 16 and resolved.roles.rollout.n == 8
    train_in_process(resolved, tmp_path / "run")
    metrics = read_metrics(tmp_path / "run")
    assert trained_rows == [16 * 8, 16 * 8]
    for row in metrics:
        # Some groups were dropped, so a second generation batch was needed to keep 16.
        assert row["dynamic_sampling/kept_groups"] < row["dynamic_sampling/total_groups"]
        assert row["dynamic_sampling/kept_groups"] >= 16
        assert row["dynamic_sampling/gen_batches"] >= 2
        assert row["dynamic_sampling/total_groups"] == 16 * row["dynamic_sampling/gen_batches"]
