"""Validation on data.val_files: schedule, sharding over ranks, per-data-source metrics, and the trainer hook."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from engine.validation import generate_sharded, should_validate, summarize  # noqa: E402

QUICKSTART = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"


def _resolved(*overrides: str):
    from rlconf.compile import compile_plan

    result = compile_plan(QUICKSTART, list(overrides))
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


def test_validation_runs_every_test_freq_steps_and_after_the_last_step():
    assert [s for s in range(1, 11) if should_validate(s, 10, 4)] == [4, 8, 10]
    assert [s for s in range(1, 11) if should_validate(s, 10, -1)] == []


def test_metrics_are_means_over_all_samples_and_per_data_source():
    metrics = summarize([1.0, 0.0, 0.5, 1.0], ["openai/gsm8k", "openai/gsm8k", "echo", "echo"], [4, 2, 3, 3])
    assert metrics == {"val/reward/mean": 0.625, "val/response_length/mean": 3.0,
                       "val/echo/reward/mean": 0.75, "val/openai/gsm8k/reward/mean": 0.5}


class EchoGroup:
    """Stands in for the worker group: each rank 'generates' its prompt ids as the response."""

    def __init__(self) -> None:
        self.shard_rows: list[list[int]] = []

    def call_sharded(self, method: str, shards):
        assert method == "generate_for_validation"
        self.shard_rows = [s["input_ids"][:, 0].tolist() for s in shards]
        return [{"responses": s["input_ids"], "response_mask": s["attention_mask"]} for s in shards]


def test_a_validation_set_that_does_not_divide_by_the_ranks_is_padded_and_trimmed():
    group = EchoGroup()
    prompts = {"input_ids": torch.arange(5)[:, None].repeat(1, 3), "attention_mask": torch.ones(5, 3, dtype=torch.long)}
    out = generate_sharded(group, prompts, replicas=2)
    assert group.shard_rows == [[0, 1, 2], [3, 4, 4]]  # the last row fills the last shard
    assert out["responses"][:, 0].tolist() == [0, 1, 2, 3, 4]


@pytest.fixture
def local_trainer(tiny_model_dir: Path, tmp_path: Path):
    """One in-process rank (LocalWorkerGroup) on the tiny model: 2 training steps, validation every step."""
    from engine.trainer import build_trainer
    from engine.workers.cluster.local import LocalWorkerGroup

    resolved = _resolved(
        f"actor_rollout_ref.model.path={tiny_model_dir}", "trainer.n_gpus_per_node=1",
        "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "data.val_files=synthetic://echo?size=5&seed=1", "actor_rollout_ref.rollout.val_kwargs.n=2",
        "trainer.total_training_steps=2", "trainer.test_freq=1", "trainer.val_before_train=true")
    environ = dict(os.environ)  # the worker sets MASTER_ADDR/RANK/...: keep them out of later tests
    trainer = build_trainer(resolved, tmp_path, LocalWorkerGroup, log=lambda line: None)
    try:
        yield trainer, tmp_path
    finally:
        trainer.close()
        trainer.group.kill()
        os.environ.clear()
        os.environ.update(environ)


def test_trainer_validates_before_training_and_after_each_step_greedily(local_trainer):
    trainer, run_dir = local_trainer
    first, again = trainer.validate(), trainer.validate()
    # Greedy decoding (val_kwargs default) on unchanged weights: the same answers every time.
    assert {k: v for k, v in first.items() if k.startswith("val/")} == {
        k: v for k, v in again.items() if k.startswith("val/")}
    trainer.train()
    lines = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [line["step"] for line in lines] == [0, 1, 2]
    for line in lines:
        assert 0.0 <= line["val/reward/mean"] <= 1.0
        assert line["val/rlconf/synthetic_echo/reward/mean"] == line["val/reward/mean"]  # one data source
        assert line["timing/validation"] > 0
    assert "reward/mean" not in lines[0]  # step 0 is the initial policy's validation only
    assert lines[0]["val/reward/mean"] == first["val/reward/mean"]


class RankEchoGroup:
    """Each rank 'generates' its prompts' first ids plus its rank, so the test sees which rank's rows are kept."""

    def __init__(self) -> None:
        self.per_rank: list[list[int]] = []

    def call_sharded(self, method: str, shards):
        self.per_rank = [s["input_ids"][:, 0].tolist() for s in shards]
        return [{"responses": s["input_ids"] + 100 * rank} for rank, s in enumerate(shards)]


def test_tensor_parallel_replicas_give_every_rank_of_a_replica_its_share_and_keep_the_first_ranks_rows():
    from engine.rollout.replicas import generate_on_replicas

    group = RankEchoGroup()
    prompts = {"input_ids": torch.arange(8)[:, None].repeat(1, 2)}
    order = torch.tensor([7, 6, 5, 4, 3, 2, 1, 0])
    out = generate_on_replicas(group, "generate", prompts, replicas=2, tensor_parallel_size=2, order=order)
    # Ranks 0-1 form replica 0, ranks 2-3 replica 1 (vLLM's consecutive layout); both ranks of a replica
    # get the same rows, and the rows come back in the prompts' order from ranks 0 and 2.
    assert group.per_rank == [[7, 6, 5, 4], [7, 6, 5, 4], [3, 2, 1, 0], [3, 2, 1, 0]]
    assert out["responses"][:, 0].tolist() == [200, 201, 202, 203, 4, 5, 6, 7]


def test_pick_generations_takes_the_same_prompts_as_verl_whatever_the_order():
    from engine.validation import pick_generations

    samples = [(p, f"answer {p}", float(i)) for i, p in enumerate("dbeac")]
    # verl: sort by prompt (a b c d e), numpy RandomState(42).shuffle -> b e c a d, take the first N
    picked = pick_generations(samples, 3)
    assert [p for p, _, _ in picked] == ["b", "e", "c"]
    assert picked[0] == ("b", "answer b", 1.0)  # prompt, response and score stay together
    assert pick_generations(list(reversed(samples)), 3) == picked
    assert len(pick_generations(samples, 10)) == 5 and pick_generations(samples, 0) == []


def test_log_val_generations_writes_n_samples_per_validation_to_the_run_dir_and_console(
        tiny_model_dir: Path, tmp_path: Path):
    from engine.trainer import build_trainer
    from engine.workers.cluster.local import LocalWorkerGroup

    resolved = _resolved(
        f"actor_rollout_ref.model.path={tiny_model_dir}", "trainer.n_gpus_per_node=1",
        "data.train_batch_size=2", "actor_rollout_ref.rollout.n=2", "actor_rollout_ref.actor.ppo_mini_batch_size=2",
        "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=4",
        "data.val_files=synthetic://echo?size=5&seed=1", "trainer.total_training_steps=1", "trainer.test_freq=1",
        "trainer.val_before_train=true", "trainer.log_val_generations=3")
    environ = dict(os.environ)
    lines: list[str] = []
    trainer = build_trainer(resolved, tmp_path, LocalWorkerGroup, log=lines.append)
    try:
        trainer.train()
    finally:
        trainer.close()
        trainer.group.kill()
        os.environ.clear()
        os.environ.update(environ)
    rows = [json.loads(line) for line in (tmp_path / "val_generations.jsonl").read_text().splitlines()]
    # validations before step 1 (step 0) and after step 1, 3 samples each, the same 3 prompts both times
    assert [row["step"] for row in rows] == [0, 0, 0, 1, 1, 1]
    assert [row["prompt"] for row in rows[:3]] == [row["prompt"] for row in rows[3:]]
    assert len({row["prompt"] for row in rows[:3]}) == 3  # 5 prompts x 1 greedy sample: 3 different ones
    for row in rows:
        assert set(row) == {"step", "prompt", "response", "score"} and row["prompt"] and 0.0 <= row["score"] <= 1.0
    console = [line for line in lines if line.startswith("[val step ")]
    assert len(console) == 6 and console[0].startswith(f"[val step 0] score={rows[0]['score']:g} ")
