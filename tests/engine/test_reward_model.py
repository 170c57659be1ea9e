"""The reward model (reward_model.enable): a FSDP scorer whose score of a row is its output at the last token.

The scorer here is `tiny://qwen2-reward` (engine/models/tiny.py build_tiny_reward_model): weights set
by hand so that its score is a known function of the tokens, the fraction of digit tokens in the
whole sequence (`tiny_reward_score`). The worker's scores must equal that function on padded rows,
packed rows, micro batches of any size, a token budget, and Ulysses over 2 ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rows import rollout_rows

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PPO_PRESET = Path(__file__).resolve().parents[2] / "presets" / "quickstart_ppo.yaml"
SEQUENCES, PROMPT_LENGTH, RESPONSE_LENGTH = 16, 6, 4
# fp32 on the CPU: the closed form and the model agree to rounding (the RMSNorm's eps is 1e-6).
SCORE_ATOL = 1e-5


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.models.tiny import build_tiny_reward_model

    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny_reward"))


def digit_ids() -> set[int]:
    from engine.models.tiny import REWARD_TOKENS, build_tokenizer

    tokenizer = build_tokenizer()
    return {tokenizer.convert_tokens_to_ids(token) for token in REWARD_TOKENS}


def scored_rows(seed: int = 0, rows: int = SEQUENCES) -> dict[str, torch.Tensor]:
    """Rollout rows whose tokens are digits about a third of the time, with empty responses among them."""
    g = torch.Generator().manual_seed(seed)
    batch = rollout_rows(torch.randint(1, PROMPT_LENGTH + 1, (rows,), generator=g),
                         torch.randint(0, RESPONSE_LENGTH + 1, (rows,), generator=g), PROMPT_LENGTH, RESPONSE_LENGTH, g)
    digits = torch.tensor(sorted(digit_ids()))
    pick = torch.rand(batch["input_ids"].shape, generator=g) < 0.35
    ids = torch.where(pick, digits[torch.randint(0, len(digits), batch["input_ids"].shape, generator=g)],
                      batch["input_ids"]) * batch["attention_mask"]
    batch["input_ids"] = ids
    batch["responses"] = ids[:, PROMPT_LENGTH:]
    return batch


def expected_scores(batch: dict[str, torch.Tensor]) -> torch.Tensor:
    from engine.models.tiny import tiny_reward_score

    targets = digit_ids()
    return torch.tensor([tiny_reward_score(ids[mask.bool()].tolist(), targets)
                         for ids, mask in zip(batch["input_ids"], batch["attention_mask"])])


def test_the_hand_set_reward_model_scores_the_fraction_of_digits_exactly(reward_model_dir):
    from engine.models.loading import load_reward_model
    from engine.workers.passes.sequence_scores import last_token_scores

    model = load_reward_model(reward_model_dir).eval()
    batch = scored_rows()
    assert (batch["response_mask"].sum(-1) == 0).any()  # an empty response: scored at the prompt's last token
    with torch.no_grad():
        padded = last_token_scores(model, batch)
    expected = expected_scores(batch)
    assert expected.std() > 0.05  # the rows differ: the test tells scores apart
    torch.testing.assert_close(padded, expected, rtol=0, atol=SCORE_ATOL)


def test_packed_rows_give_the_padded_scores(reward_model_dir):
    from engine.models.loading import load_reward_model
    from engine.workers.passes.sequence_scores import last_token_scores
    from engine.workers.sequence.packing import use_packed_attention

    model = load_reward_model(reward_model_dir).eval()
    use_packed_attention(model, torch.device("cpu"))
    batch = scored_rows(1)
    with torch.no_grad():
        packed = last_token_scores(model, batch, packed=True)
    torch.testing.assert_close(packed, expected_scores(batch), rtol=0, atol=SCORE_ATOL)


def test_a_causal_lm_is_refused_as_a_reward_model(tiny_model_dir):
    from engine.models.loading import load_reward_model

    with pytest.raises(ValueError, match="no trained score head"):
        load_reward_model(tiny_model_dir)
    load_reward_model(tiny_model_dir, fresh_head_ok=True)  # a dry run's random head is expected


def _plan(*overrides: str):
    from rlconf.compile import compile_plan

    result = compile_plan(PPO_PRESET, [
        "trainer.n_gpus_per_node=1", f"data.train_batch_size={SEQUENCES}",
        "actor_rollout_ref.actor.ppo_mini_batch_size=8", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
        "critic.ppo_micro_batch_size_per_gpu=4", f"data.max_prompt_length={PROMPT_LENGTH}",
        f"data.max_response_length={RESPONSE_LENGTH}", "reward_model.enable=true",
        "reward_model.model.path=tiny://qwen2-reward", *overrides,
    ])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


@pytest.mark.parametrize("knobs", [
    ["reward_model.micro_batch_size_per_gpu=3"],  # 16 rows: 6 micro batches, the last of one row
    ["reward_model.micro_batch_size_per_gpu=16"],
    ["reward_model.use_dynamic_bsz=true", "reward_model.forward_max_token_len_per_gpu=20"],
    ["reward_model.use_dynamic_bsz=true", "reward_model.forward_max_token_len_per_gpu=20",
     "reward_model.model.use_remove_padding=true"],
    [],  # no micro batch: the token budget (verl 0.9's reward-loop plans set none)
], ids=["micro3", "micro16", "budget", "budget_packed", "unset"])
def test_the_worker_scores_every_row_in_the_plans_micro_batches(reward_model_dir, knobs):
    from engine.workers.cluster.local import LocalWorkerGroup
    from engine.workers.roles.reward_model import RewardModelWorker

    resolved = _plan(*knobs)
    group = LocalWorkerGroup(RewardModelWorker, RewardModelWorker.ROLE, 1, resolved=resolved,
                             model_path=str(reward_model_dir))
    try:
        (info,) = group.call_all("init_model")
        assert info["params"] > 0
        batch = scored_rows(2)
        (out,) = group.call_sharded("compute_rm_score", [batch])
        torch.testing.assert_close(out["rm_scores"], expected_scores(batch), rtol=0, atol=SCORE_ATOL)
        # Any number of rows (validation, ReMax's greedy responses), not only the plan's per-GPU count.
        few = scored_rows(3, rows=5)
        (out,) = group.call_sharded("compute_rm_score", [few])
        torch.testing.assert_close(out["rm_scores"], expected_scores(few), rtol=0, atol=SCORE_ATOL)
    finally:
        group.kill()


def _ulysses_rank(rank: int, world_size: int, port: int, resolved, model_dir: str, out_path: str) -> None:
    import torch.distributed as dist

    from engine.workers.cluster.device import set_rendezvous_env
    from engine.workers.roles.reward_model import RewardModelWorker

    set_rendezvous_env(rank, world_size, "127.0.0.1", port, "127.0.0.1")
    worker = RewardModelWorker(resolved, model_dir, rank, world_size)
    worker.init_model()
    batch = scored_rows(4)  # both sp ranks of the one dp group get the same rows
    out = worker.compute_rm_score(batch)
    if rank == 0:
        torch.save({"batch": batch, "scores": out["rm_scores"]}, out_path)
    else:
        torch.save({"scores": out["rm_scores"]}, out_path + ".1")
    dist.barrier()
    worker.shutdown()


def test_ulysses_over_two_ranks_gives_the_same_scores(reward_model_dir, tmp_path):
    from ranks import spawn_ranks

    from engine.workers.cluster.failure import free_port

    resolved = _plan("trainer.n_gpus_per_node=2", "reward_model.ulysses_sequence_parallel_size=2",
                     "reward_model.model.use_remove_padding=true", "reward_model.micro_batch_size_per_gpu=5")
    assert resolved.roles.reward_model.sp_size == 2 and resolved.roles.reward_model.dp_size == 1
    out = tmp_path / "scores.pt"
    spawn_ranks(_ulysses_rank, args=(2, free_port(), resolved, str(reward_model_dir), str(out)), nprocs=2)
    first, second = torch.load(out, weights_only=False), torch.load(str(out) + ".1", weights_only=False)
    torch.testing.assert_close(first["scores"], expected_scores(first["batch"]), rtol=0, atol=SCORE_ATOL)
    torch.testing.assert_close(second["scores"], first["scores"], rtol=0, atol=0)


@pytest.mark.parametrize("packed,where,retokenized,refused", [
    (False, "response", False, True),
    (True, "response", False, True),
    (False, "padding", False, True),  # padded rows send their padding through the embedding too
    (True, "padding", False, False),  # packing drops it before the forward: nothing past the embedding is read
    (False, "response", True, True),  # input_tokenizer: the reward model's own tokenizer made the ids
], ids=["padded", "packed", "padded_pad_id", "packed_pad_id", "input_tokenizer"])
def test_a_token_id_past_the_reward_models_embedding_is_refused_before_the_forward(reward_model_dir, monkeypatch,
                                                                                   packed, where, retokenized, refused):
    """The policy's ids, fed as they are (no input_tokenizer), from a larger vocabulary than the reward model's: on a
    GPU a device-side assert inside the embedding; the worker says which id, which size and how to re-tokenize."""
    import json

    from engine.workers.cluster.failure import WorkerFailure
    from engine.workers.cluster.local import LocalWorkerGroup
    from engine.workers.roles import reward_model as role

    rows = json.loads((reward_model_dir / "config.json").read_text())["vocab_size"]
    resolved = _plan("reward_model.micro_batch_size_per_gpu=4",
                     *(["reward_model.model.use_remove_padding=true"] if packed else []),
                     *(["reward_model.model.input_tokenizer=tiny://qwen2"] if retokenized else []))
    group = LocalWorkerGroup(role.RewardModelWorker, role.RewardModelWorker.ROLE, 1, resolved=resolved,
                             model_path=str(reward_model_dir))
    try:
        group.call_all("init_model")
        batch = scored_rows(5)
        if where == "padding":
            positions = batch["attention_mask"] == 0
        else:  # a token the policy sampled
            positions = torch.zeros_like(batch["attention_mask"], dtype=torch.bool)
            positions[:, PROMPT_LENGTH:] = batch["response_mask"].bool()
        row, column = map(int, positions.nonzero()[0])
        batch["input_ids"][row, column] = rows  # the first id the reward model has no embedding row for
        if not refused:
            (out,) = group.call_sharded("compute_rm_score", [batch])
            torch.testing.assert_close(out["rm_scores"], expected_scores(batch), rtol=0, atol=SCORE_ATOL)
            return
        forward = role.forward_by_micro_batch
        monkeypatch.setattr(role, "forward_by_micro_batch", lambda *a, **k: pytest.fail("the forward ran") or forward(*a, **k))
        with pytest.raises(WorkerFailure) as failure:
            group.call_sharded("compute_rm_score", [batch])
        assert isinstance(failure.value.cause, ValueError), failure.value.cause
        message = str(failure.value.cause)
        assert f"{rows:,} rows in its input embedding" in message and f"token id {rows:,}" in message
        assert ("padding position" in message) == (where == "padding")
        if retokenized:  # the ids are the reward model's tokenizer's: its tokenizer and checkpoint disagree
            assert "re-tokenized with the tokenizer saved at" in message and "input_tokenizer=" not in message
        else:
            assert "reward_model.model.input_tokenizer=tiny://qwen2 " in message  # the policy's path (quickstart_ppo)
    finally:
        group.kill()
