"""Ulysses sequence parallelism (sp 2) computes what one rank holding whole sequences (sp 1) computes.

gloo processes on CPU, the tiny Qwen2 model (4 attention heads, 2 key/value heads) in fp32. Two ranks
(sp 2, data parallel 1) in the default suite; four (data parallel 2 × sp 2, and sp 4) marked slow.

- The real workers as the controller drives them: data parallel × sequence parallel 2, rows dealt
  by `shards_for_ranks` (each dp group's share to both of its sp ranks), sequence packing on. The
  actor's old and reference log-probs and entropy, its update (PPO clip loss with an entropy bonus
  and a KL loss; fixed micro batches and token budgets), the critic's values and its update, against
  one unsharded fp32 copy of the same weights on padded rows (sp 1): the loss over the global mini
  batch, its gradient (captured at the optimizer step), and the loss the controller reports (the
  mean over ranks of each rank's metric).
- The attention alone on plain (unsharded) models, sp 2 (and sp 4 on four ranks: fewer key/value
  heads, 2, than sp ranks, so each is repeated); the gradients of the sp ranks, summed, are the whole
  gradient.

Tolerances: the only differences are fp32 summation orders (matmuls over a row split in two, attention
per sequence instead of a masked padded batch). Measured: log-probs and entropy ~5e-7 max abs,
gradients ~2e-7 relative L2. Asserted: outputs max abs < 1e-5, losses rel < 1e-5, gradients relative
L2 < 1e-5 and elementwise rtol 1e-4 / atol 1e-6. The packed rows of the micro batches have odd
lengths too, so the padding to a multiple of sp is exercised (asserted).
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from rows import recomputing_old_log_probs, rollout_rows

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PRESETS = Path(__file__).resolve().parents[2] / "presets"
SP = 2
WORLD_SIZES = [2, pytest.param(4, marks=pytest.mark.slow)]  # data parallel 1 and 2
PROMPTS, N, MICRO = 4, 4, 2
SEQUENCES = PROMPTS * N
PROMPT_LENGTH, RESPONSE_LENGTH = 8, 6
TOKEN_BUDGET = 15  # per GPU; × sp 2 = 30 real tokens a micro batch (rows of up to 14)
TEMPERATURE = 0.7
ENTROPY_COEFF, KL_COEF = 0.01, 0.1

OUTPUT_ATOL = 1e-5
LOSS_RTOL = 1e-5
GRAD_REL_L2, GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-4, 1e-6

# name -> extra overrides of the actor's plan
ACTOR_SCENARIOS = {
    "token-mean": ["actor_rollout_ref.actor.loss_agg_mode=token-mean"],
    "seq-mean-token-mean+dynamic": ["actor_rollout_ref.actor.loss_agg_mode=seq-mean-token-mean",
                                    "actor_rollout_ref.actor.use_dynamic_bsz=true",
                                    f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={TOKEN_BUDGET}"],
}


def _compile(preset: str, world_size: int, overrides: list[str]):
    from rlconf.compile import compile_plan

    result = compile_plan(PRESETS / preset, [f"trainer.n_gpus_per_node={world_size}",
                                             f"data.max_prompt_length={PROMPT_LENGTH}",
                                             f"data.max_response_length={RESPONSE_LENGTH}", *overrides])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


def _actor_plans(world_size: int) -> dict[str, object]:
    plans = {}
    dp = world_size // SP
    for name, extra in ACTOR_SCENARIOS.items():
        plans[name] = _compile("quickstart.yaml", world_size, [
            f"data.train_batch_size={PROMPTS}", f"actor_rollout_ref.rollout.n={N}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
            f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}",
            "actor_rollout_ref.model.use_remove_padding=true",
            f"actor_rollout_ref.actor.ulysses_sequence_parallel_size={SP}",
            "actor_rollout_ref.actor.grad_clip=1e9",  # clip_grad_norm_ then multiplies by exactly 1
            f"actor_rollout_ref.actor.entropy_coeff={ENTROPY_COEFF}",
            "actor_rollout_ref.actor.use_kl_loss=true", f"actor_rollout_ref.actor.kl_loss_coef={KL_COEF}",
            f"actor_rollout_ref.rollout.temperature={TEMPERATURE}", *extra])
        actor = plans[name].roles.actor
        assert (actor.sp_size, actor.dp_size, actor.sequences_per_gpu, actor.optimizer_steps_per_train_step) == (
            SP, dp, SEQUENCES // dp, 1)
        assert plans[name].roles.ref.sp_size == SP
    return plans


def _critic_plan(world_size: int):
    dp = world_size // SP
    plan = _compile("quickstart_ppo.yaml", world_size, [
        f"data.train_batch_size={SEQUENCES}", f"critic.ppo_mini_batch_size={SEQUENCES}",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={SEQUENCES}", f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
        f"critic.ppo_micro_batch_size_per_gpu={MICRO}", f"critic.forward_micro_batch_size_per_gpu={MICRO}",
        "critic.model.use_remove_padding=true", f"critic.ulysses_sequence_parallel_size={SP}",
        "critic.grad_clip=1e9", "critic.cliprange_value=0.05"])
    critic = plan.roles.critic
    assert (critic.sp_size, critic.dp_size, critic.sequences_per_gpu, critic.grad_accum_steps) == (
        SP, dp, SEQUENCES // dp, SEQUENCES // dp // MICRO)
    return plan


def _batch(seed: int) -> dict[str, torch.Tensor]:
    """Prompts of 3..8 tokens, responses of 1..6, per-sequence advantages, targets for the critic."""
    g = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(3, PROMPT_LENGTH + 1, (SEQUENCES,), generator=g)
    response_lengths = torch.randint(1, RESPONSE_LENGTH + 1, (SEQUENCES,), generator=g)
    batch = rollout_rows(prompt_lengths, response_lengths, PROMPT_LENGTH, RESPONSE_LENGTH, g)
    mask = batch["response_mask"]
    batch.update(advantages=torch.randn(SEQUENCES, 1, generator=g).expand(-1, RESPONSE_LENGTH) * mask,
                 log_prob_shift=(torch.rand(SEQUENCES, RESPONSE_LENGTH, generator=g) - 0.5),
                 returns=torch.randn(SEQUENCES, RESPONSE_LENGTH, generator=g) * mask)
    return batch


def _drive(worker, method: str, batch: dict[str, torch.Tensor], rank: int):
    """What the controller does: dp shards, each to the sp ranks of its group; every rank's result to all."""
    import torch.distributed as dist

    from engine.batch import split_even
    from engine.workers.sequence.ulysses import shards_for_ranks

    world_size = dist.get_world_size()
    shard = shards_for_ranks(split_even(batch, world_size // SP), world_size)[rank]
    result = getattr(worker, method)(shard)
    per_rank = [None] * world_size
    dist.all_gather_object(per_rank, result)
    return per_rank


def _rows_of_groups(per_rank: list[dict[str, torch.Tensor]], key: str) -> torch.Tensor:
    from engine.workers.sequence.ulysses import one_per_group

    return torch.cat([out[key] for out in one_per_group(per_rank, len(per_rank) // SP)])


def _gradients_at_the_optimizer_step(worker, model) -> dict[str, torch.Tensor]:
    captured: dict[str, torch.Tensor] = {}
    step = worker.optimizer.step

    def step_and_capture(*args, **kwargs):
        captured.update({n: p.grad.full_tensor() for n, p in model.named_parameters()})  # collective
        worker.optimizer.step = step
        return step(*args, **kwargs)

    worker.optimizer.step = step_and_capture
    return captured


def _reference_actor(model, batch, plan) -> tuple[dict[str, torch.Tensor], dict[str, float], tuple]:
    """Unsharded, padded rows, the whole mini batch at once: gradient, loss terms, log-probs, entropy."""
    from engine.algos.kl import kl_penalty
    from engine.algos.losses import agg_loss, policy_loss
    from engine.workers.passes.logprob import response_log_probs

    actor = plan.config.actor_rollout_ref.actor
    mask, mode = batch["response_mask"], actor.loss_agg_mode
    model.zero_grad(set_to_none=True)
    log_probs, entropy = response_log_probs(model, batch, TEMPERATURE, with_entropy=True)
    pg = policy_loss(batch["old_log_probs"], log_probs, batch["advantages"], mask, actor.clip_ratio,
                     actor.clip_ratio, actor.clip_ratio_c, mode).loss
    entropy_loss = agg_loss(entropy, mask, mode)
    kl = agg_loss(kl_penalty(log_probs, batch["ref_log_probs"], actor.kl_loss_type), mask, mode)
    loss = pg - ENTROPY_COEFF * entropy_loss + KL_COEF * kl
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    terms = {"pg_loss": float(pg), "entropy_loss": float(entropy_loss), "kl_loss": float(kl), "loss": float(loss)}
    return grads, terms, (log_probs.detach(), entropy.detach())


def _reference_critic(model, batch, plan) -> tuple[dict[str, torch.Tensor], float, torch.Tensor]:
    from engine.algos.losses import value_loss
    from engine.workers.roles.critic import response_values

    critic = plan.config.critic
    model.zero_grad(set_to_none=True)
    values = response_values(model, batch)
    loss, _ = value_loss(values, batch["values"], batch["returns"], batch["response_mask"], critic.cliprange_value,
                         critic.loss_agg_mode or plan.config.actor_rollout_ref.actor.loss_agg_mode)
    loss.backward()
    return {n: p.grad.detach().clone() for n, p in model.named_parameters()}, float(loss), values.detach()


def _attention_alone(rank: int, model_dir: str) -> dict:
    """Plain models with Ulysses attention over sp 2 (and the world size): outputs and gradients against sp 1."""
    import torch.distributed as dist

    from engine.models.loading import load_causal_lm
    from engine.workers.passes.logprob import LogitOptions, response_log_probs
    from engine.workers.sequence.ulysses import sequence_parallel_group, use_ulysses_attention

    batch = rollout_rows([3, 8, 1, 5, 6, 2, 7], [6, 1, 4, 0, 3, 5, 2], PROMPT_LENGTH, RESPONSE_LENGTH,
                         torch.Generator().manual_seed(7))
    mask = batch["response_mask"].bool()
    base = load_causal_lm(model_dir)
    reference = copy.deepcopy(base)
    log_probs, entropy = response_log_probs(reference, batch, TEMPERATURE, with_entropy=True)
    ((log_probs * mask).sum() + 0.3 * (entropy * mask).sum()).backward()
    expected = {n: p.grad for n, p in reference.named_parameters()}
    out = {}
    for sp_size in sorted({SP, dist.get_world_size()}):
        model = copy.deepcopy(base)
        sp = sequence_parallel_group(sp_size)
        use_ulysses_attention(model, torch.device("cpu"), sp)
        lp, ent = response_log_probs(model, batch, TEMPERATURE, with_entropy=True, options=LogitOptions(packed=True))
        ((lp * mask).sum() + 0.3 * (ent * mask).sum()).backward()
        grads = {}
        for name, p in model.named_parameters():
            grads[name] = p.grad.clone()
            dist.all_reduce(grads[name], group=sp.group)  # the sp ranks' parts of the gradient
        out[sp_size] = {"log_probs": (lp[mask], log_probs[mask].detach()), "entropy": (ent[mask], entropy[mask].detach()),
                        "grads": (grads, expected)}
    return out


def _rank_main(rank: int, world_size: int, port: int, actor_plans: dict, critic_plan, model_dir: str,
               out_path: str) -> None:
    import torch.distributed as dist

    from engine.models.loading import load_causal_lm, load_value_model
    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker
    from engine.workers.roles.critic import CriticWorker
    from engine.workers.cluster.device import set_rendezvous_env
    from engine.workers.fsdp.sharding import full_state_dict
    from engine.workers.passes.logprob import response_log_probs

    set_rendezvous_env(rank, world_size, "127.0.0.1", port, "127.0.0.1")
    first = next(iter(actor_plans.values()))
    actor = ActorRolloutRefWorker(first, model_dir, rank, world_size, total_training_steps=1, pad_token_id=0,
                                  eos_token_id=1)
    actor.init_model()
    results: dict = {"actor": {}}
    reference = load_causal_lm(model_dir) if rank == 0 else None
    initial = load_causal_lm(model_dir) if rank == 0 else None  # the reference policy's weights
    for seed, (name, plan) in enumerate(actor_plans.items()):
        actor.resolved = recomputing_old_log_probs(plan)  # the batches carry shifted old log-probs
        batch = _batch(seed)
        shift = batch.pop("log_prob_shift")
        old = _drive(actor, "compute_log_prob", batch, rank)
        ref = _drive(actor, "compute_ref_log_prob", batch, rank)
        batch["old_log_probs"] = _rows_of_groups(old, "old_log_probs") + shift
        batch["ref_log_probs"] = _rows_of_groups(ref, "ref_log_probs")
        weights = full_state_dict(actor.actor)  # collective
        sharded = _gradients_at_the_optimizer_step(actor, actor.actor)
        metrics = _drive(actor, "update_actor", batch, rank)
        if rank == 0:
            reference.load_state_dict(weights)
            grads, terms, (log_probs, entropy) = _reference_actor(reference, batch, plan)
            with torch.no_grad():
                ref_log_probs, _ = response_log_probs(initial, batch, TEMPERATURE)
            results["actor"][name] = {
                "batch": batch, "old": old, "ref": ref, "metrics": metrics, "sharded": sharded, "plan": grads,
                "terms": terms, "log_probs": log_probs, "entropy": entropy, "ref_log_probs": ref_log_probs}
    critic = CriticWorker(critic_plan, model_dir, rank, world_size, total_training_steps=1)
    critic.init_model()
    batch = {k: v for k, v in _batch(10).items() if k not in ("advantages", "log_prob_shift")}
    values = _drive(critic, "compute_values", batch, rank)
    batch["values"] = _rows_of_groups(values, "values") + 0.05 * batch["returns"]  # some tokens clip
    weights = full_state_dict(critic.critic)
    sharded = _gradients_at_the_optimizer_step(critic, critic.critic)
    metrics = _drive(critic, "update_critic", batch, rank)
    if rank == 0:
        reference_critic = load_value_model(model_dir)
        reference_critic.load_state_dict(weights)
        grads, loss, expected_values = _reference_critic(reference_critic, batch, critic_plan)
        results["critic"] = {"batch": batch, "values": values, "metrics": metrics, "sharded": sharded, "plan": grads,
                             "loss": loss, "expected_values": expected_values}
    results["attention"] = _attention_alone(rank, model_dir)
    if rank == 0:
        torch.save(results, out_path)
    dist.barrier()
    actor.shutdown()


@pytest.fixture(scope="module", params=WORLD_SIZES, ids=lambda world: f"{world}ranks")
def runs(request: pytest.FixtureRequest, tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from ranks import spawn_ranks

    from engine.workers.cluster.failure import free_port

    world_size = request.param
    out = tmp_path_factory.mktemp("ulysses") / "results.pt"
    spawn_ranks(_rank_main, args=(world_size, free_port(), _actor_plans(world_size), _critic_plan(world_size),
                                  str(tiny_model_dir), str(out)), nprocs=world_size)
    results = torch.load(out, weights_only=False)
    results["world_size"] = world_size
    return results


def assert_same_gradients(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    diff = sum(float((actual[k] - expected[k]).pow(2).sum()) for k in expected)
    norm = sum(float(expected[k].pow(2).sum()) for k in expected)
    assert norm > 0
    assert (diff / norm) ** 0.5 < GRAD_REL_L2, f"relative L2 error {(diff / norm) ** 0.5:.2e}"
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)


def assert_same_response_values(per_rank: list[dict], key: str, expected: torch.Tensor, mask: torch.Tensor) -> None:
    """Both sp ranks of a group return the same rows; together the groups give the reference's values."""
    for group in range(len(per_rank) // SP):
        torch.testing.assert_close(per_rank[group * SP][key], per_rank[group * SP + 1][key], rtol=0, atol=0)
    actual = _rows_of_groups(per_rank, key)
    assert float((actual - expected)[mask.bool()].abs().max()) < OUTPUT_ATOL


def _controller_mean(per_rank: list[dict], key: str) -> float:
    return sum(m[key] for m in per_rank) / len(per_rank)


@pytest.mark.parametrize("scenario", list(ACTOR_SCENARIOS))
def test_old_log_probs_and_entropy_over_sp_ranks_are_the_unsplit_models(runs, scenario):
    run = runs["actor"][scenario]
    mask = run["batch"]["response_mask"]
    assert_same_response_values(run["old"], "old_log_probs", run["log_probs"], mask)
    assert_same_response_values(run["old"], "entropy", run["entropy"], mask)


@pytest.mark.parametrize("scenario", list(ACTOR_SCENARIOS))
def test_reference_log_probs_over_sp_ranks_are_the_unsplit_models(runs, scenario):
    run = runs["actor"][scenario]
    assert_same_response_values(run["ref"], "ref_log_probs", run["ref_log_probs"], run["batch"]["response_mask"])


@pytest.mark.parametrize("scenario", list(ACTOR_SCENARIOS))
def test_actor_update_over_sp_ranks_gives_the_gradient_of_the_plans_loss(runs, scenario):
    run = runs["actor"][scenario]
    assert_same_gradients(run["sharded"], run["plan"])


@pytest.mark.parametrize("scenario", list(ACTOR_SCENARIOS))
def test_the_loss_the_controller_reports_is_the_global_mini_batchs(runs, scenario):
    run = runs["actor"][scenario]
    for term, value in run["terms"].items():
        assert _controller_mean(run["metrics"], f"actor/{term}") == pytest.approx(value, rel=LOSS_RTOL, abs=1e-7), term


def test_token_budget_counts_sp_times_the_per_gpu_budget_and_ranks_agree(runs):
    import math

    from engine.batch import split_even

    dp = runs["world_size"] // SP
    fixed = runs["actor"]["token-mean"]["metrics"]
    assert {m["actor/grad_accum_steps"] for m in fixed} == {SEQUENCES // dp // MICRO}
    dynamic = runs["actor"]["seq-mean-token-mean+dynamic"]
    (accum,) = {m["actor/grad_accum_steps"] for m in dynamic["metrics"]}
    # A micro batch holds at most 15 × sp 2 = 30 real tokens (rows of up to 14): more than 15 alone would allow.
    tokens = max(int(part["attention_mask"].sum()) for part in split_even(dynamic["batch"], dp))
    assert math.ceil(tokens / (TOKEN_BUDGET * SP)) <= accum < math.ceil(tokens / TOKEN_BUDGET), (tokens, accum)


def test_some_packed_micro_batch_has_an_odd_length_so_the_padding_to_sp_runs(runs):
    from engine.batch import split_even

    dp = runs["world_size"] // SP
    batch = runs["actor"]["token-mean"]["batch"]
    lengths = [int(part["attention_mask"][k:k + MICRO].sum()) for part in split_even(batch, dp)
               for k in range(0, SEQUENCES // dp, MICRO)]
    assert any(length % SP for length in lengths), lengths


def test_critic_values_over_sp_ranks_are_the_unsplit_models(runs):
    run = runs["critic"]
    assert_same_response_values(run["values"], "values", run["expected_values"], run["batch"]["response_mask"])


def test_critic_update_over_sp_ranks_gives_the_gradient_of_the_plans_loss(runs):
    run = runs["critic"]
    assert_same_gradients(run["sharded"], run["plan"])
    assert _controller_mean(run["metrics"], "critic/vf_loss") == pytest.approx(run["loss"], rel=LOSS_RTOL)
    assert {m["critic/grad_accum_steps"] for m in run["metrics"]} == {SEQUENCES // (runs["world_size"] // SP) // MICRO}


def test_ulysses_attention_alone_matches_sp_1_including_key_value_heads_repeated_for_sp_4(runs):
    assert sorted(runs["attention"]) == sorted({SP, runs["world_size"]})
    for sp_size, run in runs["attention"].items():
        for key in ("log_probs", "entropy"):
            actual, expected = run[key]
            assert float((actual.detach() - expected).abs().max()) < OUTPUT_ATOL, (sp_size, key)
        assert_same_gradients(*run["grads"])


def test_shards_for_ranks_gives_each_dp_groups_share_to_its_consecutive_sp_ranks():
    from engine.workers.sequence.ulysses import one_per_group, shards_for_ranks

    assert shards_for_ranks(["a", "b"], 4) == ["a", "a", "b", "b"]
    assert shards_for_ranks(["a", "b", "c", "d"], 4) == ["a", "b", "c", "d"]
    assert one_per_group(["a", "a", "b", "b"], 2) == ["a", "b"]
    with pytest.raises(ValueError, match="3 data-parallel shards do not spread evenly over 4 ranks"):
        shards_for_ranks(["a", "b", "c"], 4)
