"""Two FSDP2 actor ranks produce the gradient the plan promises for one optimizer step.

The sharded side is the real `ActorRolloutRefWorker.update_actor` on 2 gloo processes: its own
split into micro batches, each micro batch's share of the mini batch's loss (`policy_loss` on
`response_log_probs`), FSDP2 reduce-scatter. The reference is one unsharded fp32 copy of the same weights computing the
loss once over the whole global mini batch (16 sequences = train_batch_size 4 × n 4), which is
what the plan means: `ppo_mini_batch_size` is global, so one optimizer step minimises one loss
aggregated over the global mini batch (`loss_agg_mode`, engine/algos/losses.py::agg_loss).

Each rank holds 8 sequences in 4 micro batches of 2, so the global mini batch is 8 micro batches.
Tolerance: fp32 on CPU, the only difference being matmul blocking over different batch shapes;
the measured relative L2 error is ~1e-7, asserted below 1e-5 (elementwise rtol 1e-4, atol 1e-7).

Ragged response lengths are where a naive accumulation (the mean of per-micro-batch token means)
goes wrong: a token in a micro batch with few valid tokens weighs more. The actor backpropagates each
micro batch's share of the global mini batch's loss (engine/workers/passes/ppo_update.py), so it matches the
plan in every mode; a guard test checks that the naive mean really differs on these batches, so the
equivalence is not vacuous.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from rows import recomputing_old_log_probs, rollout_rows

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

QUICKSTART = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"
WORLD_SIZE = 2
PROMPTS, N, MICRO = 4, 4, 2
SEQUENCES = PROMPTS * N
PROMPT_LENGTH, RESPONSE_LENGTH = 8, 6
MICRO_BATCHES_PER_MINI_BATCH = SEQUENCES // MICRO  # over both ranks

# name -> (loss_agg_mode, response lengths of the 16 sequences)
SCENARIOS: dict[str, tuple[str, list[int]]] = {
    # Every micro batch has 8 valid tokens: per-micro token-means average to the global one.
    "token-mean/equal-lengths": ("token-mean", [4] * SEQUENCES),
    # Micro batches hold 2..12 valid tokens.
    "token-mean/ragged": ("token-mean", [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    "seq-mean-token-mean/ragged": ("seq-mean-token-mean", [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    "seq-mean-token-sum/ragged": ("seq-mean-token-sum", [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    "seq-mean-token-sum-norm/ragged": ("seq-mean-token-sum-norm", [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    # use_dynamic_bsz: micro batches of at most TOKEN_BUDGET padded tokens, as many as the fullest rank needs.
    "token-mean+dynamic/ragged": ("token-mean+dynamic", [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    "seq-mean-token-sum-norm+dynamic/ragged": ("seq-mean-token-sum-norm+dynamic",
                                               [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    # use_remove_padding: each micro batch packed into one row (old log-probs too); the reference stays padded.
    "token-mean+packed/ragged": ("token-mean+packed", [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    # ... with token budgets that count real tokens.
    "seq-mean-token-mean+packed+dynamic/ragged": ("seq-mean-token-mean+packed+dynamic",
                                                  [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    # use_fused_kernels: log-probs from the hidden states and FSDP2's gathered head weight
    # (engine/workers/sequence/fused_head.py); the reference keeps the plain logits path.
    "token-mean+fused/ragged": ("token-mean+fused", [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    "token-mean+packed+fused/ragged": ("token-mean+packed+fused", [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    # fsdp_config.use_no_sync_for_gradient_accumulation: unsharded accumulation, one reduce-scatter a step.
    "token-mean+no_sync/ragged": ("token-mean+no_sync", [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    # fsdp_config.reshard_after_forward=false: gathered weights kept through the step's micro batches.
    "token-mean+no_reshard/ragged": ("token-mean+no_reshard", [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
    "seq-mean-token-mean+packed+no_reshard+no_sync/ragged": ("seq-mean-token-mean+packed+no_reshard+no_sync",
                                                             [1, 1, 6, 6, 2, 5, 3, 3, 1, 2, 6, 5, 4, 4, 6, 1]),
}
TOKEN_BUDGET = 30  # >= one full sequence (8 + 6), so 2..3 rows a micro batch

REL_L2_TOLERANCE = 1e-5
ELEMENT_RTOL, ELEMENT_ATOL = 1e-4, 1e-7

def _plans() -> dict[str, object]:
    from rlconf.compile import compile_plan

    plans = {}
    for key in {key for key, _ in SCENARIOS.values()}:
        mode, dynamic, packed, fused = key.split("+")[0], "+dynamic" in key, "+packed" in key, "+fused" in key
        fsdp = "actor_rollout_ref.actor.fsdp_config"
        result = compile_plan(QUICKSTART, [
            f"trainer.n_gpus_per_node={WORLD_SIZE}",
            f"data.train_batch_size={PROMPTS}", f"actor_rollout_ref.rollout.n={N}",
            f"actor_rollout_ref.actor.ppo_mini_batch_size={PROMPTS}",
            f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
            f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
            f"data.max_prompt_length={PROMPT_LENGTH}", f"data.max_response_length={RESPONSE_LENGTH}",
            # No clipping: clip_grad_norm_ then multiplies by exactly 1.0, so the grads stay raw.
            "actor_rollout_ref.actor.grad_clip=1e9",
            f"actor_rollout_ref.actor.loss_agg_mode={mode}",
            *(["actor_rollout_ref.actor.use_dynamic_bsz=true",
               f"actor_rollout_ref.actor.ppo_max_token_len_per_gpu={TOKEN_BUDGET}"] if dynamic else []),
            *(["actor_rollout_ref.model.use_remove_padding=true"] if packed else []),
            *(["actor_rollout_ref.model.use_fused_kernels=true"] if fused else []),
            *([f"{fsdp}.reshard_after_forward=false"] if "+no_reshard" in key else []),
            *([f"{fsdp}.use_no_sync_for_gradient_accumulation=true"] if "+no_sync" in key else []),
        ])
        assert result.resolved is not None, [d.message for d in result.diagnostics]
        actor = result.resolved.roles.actor
        assert (actor.sequences_per_gpu, actor.optimizer_steps_per_train_step) == (8, 1)
        assert actor.grad_accum_steps == (None if dynamic else 4)
        plans[key] = recomputing_old_log_probs(result.resolved)  # the batches carry shifted old log-probs
    return plans


def _batch(response_lengths: list[int], seed: int) -> dict[str, torch.Tensor]:
    """Left-padded prompts of 3..8 tokens, right-padded responses; per-sequence advantages."""
    g = torch.Generator().manual_seed(seed)
    prompt_lengths = torch.randint(3, PROMPT_LENGTH + 1, (SEQUENCES,), generator=g)
    batch = rollout_rows(prompt_lengths, response_lengths, PROMPT_LENGTH, RESPONSE_LENGTH, g)
    batch.update(
        advantages=torch.randn(SEQUENCES, 1, generator=g).expand(-1, RESPONSE_LENGTH) * batch["response_mask"],
        # Moves the old policy off the current one so ratios spread over and past the clip range.
        log_prob_shift=(torch.rand(SEQUENCES, RESPONSE_LENGTH, generator=g) - 0.5),
    )
    return batch


def _loss_grads(model, batch, plan, micro_batches: list[slice]) -> dict[str, torch.Tensor]:
    """Gradient of mean_k(loss over rows micro_batches[k]) on an unsharded model."""
    from engine.algos.losses import policy_loss
    from engine.workers.passes.logprob import response_log_probs

    actor = plan.config.actor_rollout_ref.actor
    model.zero_grad(set_to_none=True)
    for rows in micro_batches:
        part = {k: v[rows] for k, v in batch.items()}
        log_probs, _ = response_log_probs(model, part, temperature=1.0)
        loss = policy_loss(part["old_log_probs"], log_probs, part["advantages"], part["response_mask"],
                           actor.clip_ratio, actor.clip_ratio, actor.clip_ratio_c, actor.loss_agg_mode).loss
        (loss / len(micro_batches)).backward()
    return {name: p.grad.detach().clone() for name, p in model.named_parameters()}


def _gradients_at_the_optimizer_step(worker) -> dict[str, torch.Tensor]:
    """Filled with the full gradients when the worker's next update steps its optimizer (which frees them after)."""
    captured: dict[str, torch.Tensor] = {}
    step = worker.optimizer.step

    def step_and_capture(*args, **kwargs):
        captured.update({n: p.grad.full_tensor() for n, p in worker.actor.named_parameters()})  # collective
        worker.optimizer.step = step  # once: the plan has one optimizer step per update here
        return step(*args, **kwargs)

    worker.optimizer.step = step_and_capture
    return captured


def _count_fused_head_calls() -> dict[str, int]:
    """Counts of the fused Function's forward and backward passes in this process (a spy)."""
    from engine.workers.sequence.fused_head import FusedLinearLogProbs

    counts = {"forward": 0, "backward": 0}
    forward, backward = FusedLinearLogProbs.forward, FusedLinearLogProbs.backward

    def counted(name, real):
        return staticmethod(lambda ctx, *args: counts.__setitem__(name, counts[name] + 1) or real(ctx, *args))

    FusedLinearLogProbs.forward, FusedLinearLogProbs.backward = counted("forward", forward), counted("backward", backward)
    return counts


def _record_fsdp_settings(model) -> list[tuple[str, bool]]:
    """(setter, value) for each call of FSDP2's between-micro-batch setters on `model` (a spy)."""
    calls: list[tuple[str, bool]] = []

    def spy(name: str):
        real = getattr(model, name)

        def recorded(value: bool, **kwargs) -> None:
            calls.append((name, value))
            real(value, **kwargs)
        return recorded

    for name in ("set_reshard_after_backward", "set_requires_gradient_sync"):
        setattr(model, name, spy(name))
    return calls


def _rank_main(rank: int, port: int, plans: dict, model_dir: str, out_path: str) -> None:
    """One actor rank: run every scenario's update_actor on this rank's half; rank 0 also computes references."""
    from engine.models.loading import load_causal_lm
    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker
    from engine.workers.cluster.device import set_rendezvous_env
    from engine.workers.fsdp.sharding import full_state_dict

    first_plan = next(iter(plans.values()))
    set_rendezvous_env(rank, WORLD_SIZE, "127.0.0.1", port, "127.0.0.1")
    worker = ActorRolloutRefWorker(first_plan, model_dir, rank, WORLD_SIZE, total_training_steps=1,
                                   pad_token_id=0, eos_token_id=1)
    worker.init_model()
    reference = load_causal_lm(model_dir) if rank == 0 else None
    fused_calls = _count_fused_head_calls()
    fsdp_calls = _record_fsdp_settings(worker.actor)
    results = {}
    for seed, (name, (mode, lengths)) in enumerate(SCENARIOS.items()):
        # The worker reads loss_agg_mode from its plan on every call; swapping the plan switches modes.
        worker.resolved = plans[mode]
        # The worker wraps its model once, with the first plan's reshard_after_forward; this is what
        # a plan with reshard_after_forward=false would have wrapped it with.
        worker.actor.set_reshard_after_forward("+no_reshard" not in mode)
        fused_calls.update(forward=0, backward=0)
        batch = _batch(lengths, seed)
        shift = batch.pop("log_prob_shift")
        # Old log-probs from the worker's own forward pass (identical on both ranks: same weights, same rows).
        batch["old_log_probs"] = worker.compute_log_prob(batch)["old_log_probs"] + shift
        old_log_prob_calls = dict(fused_calls)
        weights = full_state_dict(worker.actor)  # collective; the optimizer step of the last scenario moved them
        half = slice(rank * SEQUENCES // WORLD_SIZE, (rank + 1) * SEQUENCES // WORLD_SIZE)
        sharded = _gradients_at_the_optimizer_step(worker)
        fsdp_calls.clear()
        metrics = worker.update_actor({k: v[half] for k, v in batch.items()})
        grads_freed = all(p.grad is None for p in worker.actor.parameters())
        update_calls = {k: fused_calls[k] - old_log_prob_calls[k] for k in fused_calls}
        if rank == 0:
            reference.load_state_dict(weights)
            micro_slices = [slice(s, s + MICRO) for s in range(0, SEQUENCES, MICRO)]
            results[name] = {
                "sharded": sharded,
                "grad_norm_metric": metrics["actor/grad_norm"],
                "grads_freed": grads_freed,
                "fused_calls": {"compute_log_prob": old_log_prob_calls, "update_actor": update_calls},
                "grad_accum_steps": metrics["actor/grad_accum_steps"],
                "fsdp_calls": list(fsdp_calls),
                "plan": _loss_grads(reference, batch, plans[mode], [slice(0, SEQUENCES)]),
                "mean_of_micro_losses": _loss_grads(reference, batch, plans[mode], micro_slices),
            }
    if rank == 0:
        torch.save(results, out_path)
    worker.shutdown()


@pytest.fixture(scope="module")
def gradients(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict:
    from ranks import spawn_ranks

    from engine.workers.cluster.failure import free_port

    out = tmp_path_factory.mktemp("grads") / "grads.pt"
    plans = _plans()
    spawn_ranks(_rank_main, args=(free_port(), plans, str(tiny_model_dir), str(out)), nprocs=WORLD_SIZE)
    return torch.load(out)


def relative_l2_error(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> float:
    assert actual.keys() == expected.keys()
    diff = sum(float((actual[k] - expected[k]).pow(2).sum()) for k in expected)
    norm = sum(float(expected[k].pow(2).sum()) for k in expected)
    return (diff / norm) ** 0.5


def assert_same_gradients(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    error = relative_l2_error(actual, expected)
    assert error < REL_L2_TOLERANCE, f"relative L2 error of the gradients {error:.3e} >= {REL_L2_TOLERANCE:.0e}"
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=ELEMENT_RTOL, atol=ELEMENT_ATOL, msg=name)


@pytest.mark.parametrize("scenario", list(SCENARIOS))
def test_two_fsdp_ranks_give_the_gradient_of_the_plans_loss_over_the_global_mini_batch(gradients, scenario):
    result = gradients[scenario]
    assert_same_gradients(result["sharded"], result["plan"])


def test_reported_grad_norm_is_the_norm_of_the_global_gradient(gradients):
    result = gradients["token-mean/equal-lengths"]
    norm = sum(float(g.pow(2).sum()) for g in result["plan"].values()) ** 0.5
    assert result["grad_norm_metric"] == pytest.approx(norm, rel=1e-5)


def test_on_ragged_lengths_the_mean_of_the_8_micro_batch_token_means_is_a_different_gradient(gradients):
    """Guards the equivalence above against passing vacuously: naive accumulation would fail it.

    (The sequence-mean modes average equal-sized micro batches, so there naive accumulation is exact.)
    """
    result = gradients["token-mean/ragged"]
    assert relative_l2_error(result["mean_of_micro_losses"], result["plan"]) > 100 * REL_L2_TOLERANCE


def test_the_update_frees_the_gradients_so_they_do_not_occupy_memory_through_the_next_rollout(gradients):
    assert all(result["grads_freed"] for result in gradients.values())


def test_token_budget_micro_batches_are_cut_to_the_budget_and_agreed_over_the_ranks(gradients):
    """The dynamic scenarios really ran several micro batches (the same count on both ranks: no hang)."""
    for name, result in gradients.items():
        if "+dynamic" in name:
            assert result["grad_accum_steps"] >= 3  # 8 rows of up to 14 tokens, at most 30 tokens a micro batch
        else:
            assert result["grad_accum_steps"] == 4


def test_fused_kernels_run_in_compute_log_prob_and_update_actor_only_when_the_plan_sets_them(gradients):
    """use_fused_kernels is applied by the worker: one fused forward per micro batch of 2 rows in
    compute_log_prob (all 16 rows here: 8) and in update_actor (this rank's 8 rows: 4), one backward
    per update micro batch; none without the knob."""
    for name, result in gradients.items():
        old, update = (8, 4) if "+fused" in name else (0, 0)
        assert result["fused_calls"] == {"compute_log_prob": {"forward": old, "backward": 0},
                                         "update_actor": {"forward": update, "backward": update}}, name


def test_fsdp_knobs_between_micro_batches_reach_fsdp2_only_when_the_plan_sets_them(gradients):
    """reshard_after_forward=false keeps the gathered weights and use_no_sync_for_gradient_accumulation
    holds the reduce-scatter over the 3 first of the 4 micro batches, releasing both before the last
    backward; without the knobs FSDP2's defaults (reshard, sync every micro batch) are left alone."""
    for name, result in gradients.items():
        expected = []
        for value in (False, False, False, True):
            expected += [("set_reshard_after_backward", value)] if "+no_reshard" in name else []
            expected += [("set_requires_gradient_sync", value)] if "+no_sync" in name else []
        assert result["fsdp_calls"] == expected, name
