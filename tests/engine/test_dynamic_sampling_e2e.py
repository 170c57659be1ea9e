"""DAPO dynamic sampling on the CPU quickstart: groups whose responses all score the same are dropped,
more prompts are generated in rounds of data.gen_batch_size, and the trained batch is still
train_batch_size × n rows."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launching import compile_preset, read_metrics, train_in_process  # noqa: E402

GEN_BATCH_SIZE = 32  # 2 × train_batch_size 16, as verl's DAPO scripts draw more prompts than they train


def informative(truth: str) -> bool:
    """The score below: prompts whose answer has 4 letters (blue, moon, star: 40 % of the data) get responses
    that disagree, so a round of 32 prompts keeps about 13 groups and a step needs two rounds."""
    return len(truth) == 4


def expected_rounds(truths_in_draw_order: list[str], steps: int, gen: int, train: int) -> list[tuple[int, int, int]]:
    """(rounds, kept groups, total groups) of each step, replaying the rounds on the drawn prompts."""
    out, start = [], 0
    for _ in range(steps):
        rounds = kept = 0
        while kept < train:
            kept += sum(informative(t) for t in truths_in_draw_order[start:start + gen])
            start, rounds = start + gen, rounds + 1
        out.append((rounds, kept, rounds * gen))
    return out


def test_filter_groups_draws_generation_batches_until_enough_groups_trains_a_full_batch_and_resumes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import engine.controller.stages
    import engine.rewards.managers
    from engine.data.dataset import BatchOrder

    trained_rows: list[int] = []
    real = engine.controller.stages.compute_advantages

    def score(fn, texts, sources, truths, extras):
        # Prompts of other answers score 0 whatever the response (a uniform group, to be dropped); the
        # informative ones alternate 0, 1 over their rows, so the 8 responses of a group (adjacent rows)
        # always disagree: which groups are kept depends on the data alone.
        return [float(row % 2) if informative(truth) else 0.0 for row, truth in enumerate(truths)]

    def capture(algorithm, token_rewards, group_ids, batch, reward_baselines=None):
        trained_rows.append(token_rewards.shape[0])
        assert len(set(group_ids)) == 16  # exactly train_batch_size groups, numbered apart
        return real(algorithm, token_rewards, group_ids, batch, reward_baselines)

    monkeypatch.setattr(engine.rewards.managers, "score_responses", score)
    monkeypatch.setattr(engine.controller.stages, "compute_advantages", capture)
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("quickstart.yaml", ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
                                                  "trainer.save_freq=1",
                                                  f"data.gen_batch_size={GEN_BATCH_SIZE}",
                                                  "algorithm.filter_groups.enable=true",
                                                  "algorithm.filter_groups.metric=score"])
    assert resolved.config.data.train_batch_size == 16 and resolved.roles.rollout.n == 8
    trainer = train_in_process(resolved, tmp_path / "run", checkpoints=True)
    metrics = read_metrics(tmp_path / "run")
    assert trained_rows == [16 * 8, 16 * 8]

    # verl batches the data by gen_batch_size: 2048 prompts ÷ 32 = 64 batches (steps) an epoch, not 2048 ÷ 16.
    assert (trainer.order.batch_size, trainer.order.batches_per_epoch) == (32, 64)
    # The engine's rounds, against a replay of the same seeded order over the dataset's answers.
    replay = BatchOrder(len(trainer.dataset), GEN_BATCH_SIZE, seed=0)
    drawn = [trainer.dataset.rows[i]["reward_model"]["ground_truth"] for i in replay.permutation(0)]
    expected = expected_rounds(drawn, steps=2, gen=GEN_BATCH_SIZE, train=16)
    got = [(row["dynamic_sampling/gen_batches"], row["dynamic_sampling/kept_groups"],
            row["dynamic_sampling/total_groups"]) for row in metrics]
    assert got == expected
    # The replay on quickstart's data (synthetic, seed 0): step 1 keeps 8 + 9 = 17 groups of 2 × 32 prompts,
    # step 2 keeps 23 of the next 64; each is trimmed to 16.
    assert expected == [(2, 17, 64), (2, 23, 64)]
    # Every round drew one generation batch from the order, and the rounds of both steps fit in epoch 0.
    assert trainer.order.state_dict()["position"] == sum(rounds for rounds, _, _ in expected)
    assert trainer.order.epoch == 0

    # Resumed from step 1's checkpoint, step 2 draws the same two generation batches (positions 2 and 3).
    from engine.trainer import build_trainer
    from engine.workers.cluster.local import LocalWorkerGroup

    resumed = build_trainer(resolved, tmp_path / "resumed", LocalWorkerGroup, log=lambda line: None)
    try:
        resumed.load_checkpoint(tmp_path / "run" / "checkpoints" / "global_step_1")
        assert resumed.order.state_dict()["position"] == 2
        resumed.train()
    finally:
        resumed.close()
        resumed.group.kill()
    (step2,) = read_metrics(tmp_path / "resumed")
    assert step2["step"] == 2 and step2["dynamic_sampling/gen_batches"] == 2
    assert (step2["dynamic_sampling/kept_groups"], step2["dynamic_sampling/total_groups"]) == (23, 64)
    assert resumed.order.state_dict() == trainer.order.state_dict()
