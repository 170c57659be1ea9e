"""Normalization: global algorithmic sizes -> per-GPU values, each with the formula it came from.

This is the one place that computes batch arithmetic. It mirrors verl's worker constructors
(verl/workers/fsdp_workers.py, ActorRolloutRefWorker.__init__ and CriticWorker.__init__):

    ppo_mini_batch_size_per_gpu = ppo_mini_batch_size × rollout.n ÷ (world ÷ ulysses_sp)
    <deprecated>_micro_batch_size_per_gpu = <deprecated>_micro_batch_size ÷ (world ÷ ulysses_sp)
    grad_accum_steps = ppo_mini_batch_size_per_gpu ÷ ppo_micro_batch_size_per_gpu

verl floors these divisions silently; here every division also records whether it was exact,
and rlconf/rules turns an inexact one into an error that names the nearest valid values.
All functions are total (no exceptions on bad numbers) so the rules can run on any plan the
schema accepts; an undefined value (a division by zero) is `None`.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

from rlconf.reward_loop import ServedRewardModel, served_reward_model, serves_reward_model
from rlconf.schema import PlanConfig
from rlconf.schema.sections import GROUP_ESTIMATORS


class Q(NamedTuple):
    """A derived number, the formula that produced it, and whether the division was exact."""

    value: int | None
    formula: str
    exact: bool = True


def given(value: int | None, source: str) -> Q:
    """A value the plan states directly; the formula names the key (its last two parts)."""
    short = ".".join(source.split(".")[-2:]) if source.count(".") > 1 else source
    return Q(value, f"{short} = {value}")


def divide(numerator: int | None, denominator: int | None, text: str) -> Q:
    """`text` shows the operands; the result is floored like verl's `//=` and flagged if inexact."""
    if numerator is None or not denominator:
        return Q(None, f"{text} = undefined", exact=False)
    value = numerator // denominator
    exact = numerator % denominator == 0
    return Q(value, f"{text} = {value}" if exact else f"{text} = {numerator / denominator:g} (not a whole number)", exact)


def divide_up(numerator: int, denominator: int, text: str) -> Q:
    """Rounded up, flagged if inexact: a step is cut into mini batches like verl's
    `DataProto.split(size)` does, which keeps a short last chunk (verl dp_actor.update_policy)."""
    value = -(-numerator // denominator)
    exact = numerator % denominator == 0
    return Q(value, f"{text} = {value}" if exact else f"⌈{text}⌉ = {value} (the last one is short)", exact)


class Pool(NamedTuple):
    name: str
    nnodes: int
    gpus_per_node: int

    @property
    def gpus(self) -> int:
        return self.nnodes * self.gpus_per_node


class Placement(NamedTuple):
    cluster_gpus: int
    pools: dict[str, Pool]
    roles: dict[str, str]  # role -> pool name, only for the roles this plan runs

    def pool_of(self, role: str) -> Pool | None:
        name = self.roles.get(role)
        return self.pools.get(name) if name else None


def active_roles(plan: PlanConfig) -> list[str]:
    """The roles a training step needs: actor and rollout always, others by algorithm."""
    roles = ["actor", "rollout"]
    if needs_reference(plan):
        roles.append("ref")
    if plan.algorithm.adv_estimator == "gae":
        roles.append("critic")
    if plan.reward_model.enable and not serves_reward_model(plan):  # a served one is no FSDP role (rlconf.reward_loop)
        roles.append("reward_model")
    return roles


def needs_reference(plan: PlanConfig) -> bool:
    return plan.actor_rollout_ref.actor.use_kl_loss or plan.algorithm.use_kl_in_reward


def rollout_pool_size(plan: PlanConfig) -> Pool | None:
    """verl's standalone rollout pool (`actor_rollout_ref.rollout.nnodes` > 0), or None when rollout is colocated.

    As in verl 0.9.1's one-step off-policy trainer (experimental/separation/utils.py
    create_resource_pool_manager), trainer.nnodes × trainer.n_gpus_per_node are the training GPUs and the
    rollout pool comes on top of them.
    """
    rollout = plan.actor_rollout_ref.rollout
    if rollout.nnodes == 0:
        return None
    return Pool("rollout", rollout.nnodes, rollout.n_gpus_per_node or plan.trainer.n_gpus_per_node)


def placement(plan: PlanConfig) -> Placement:
    trainer = plan.trainer
    cluster = trainer.nnodes * trainer.n_gpus_per_node
    roles = active_roles(plan)
    # With hybrid_engine on, rollout stays on the actor's GPUs whatever rollout.nnodes says (RL362 says so).
    standalone = None if plan.actor_rollout_ref.hybrid_engine else rollout_pool_size(plan)
    if plan.placement is None and standalone is not None:
        pools = {"trainer": Pool("trainer", trainer.nnodes, trainer.n_gpus_per_node), "rollout": standalone}
        return Placement(cluster + standalone.gpus, pools,
                         {role: "rollout" if role == "rollout" else "trainer" for role in roles})
    if plan.placement is None:
        pool = Pool("global", trainer.nnodes, trainer.n_gpus_per_node)
        return Placement(cluster, {"global": pool}, {role: "global" for role in roles})
    pools = {name: Pool(name, spec.nnodes, spec.n_gpus_per_node) for name, spec in plan.placement.pools.items()}
    mapped = {role: pool for role, pool in plan.placement.roles.items() if role in roles}
    return Placement(cluster, pools, mapped)


# --- per-role results -------------------------------------------------------------------------


class ForwardPass(NamedTuple):
    """A forward-only pass over the step's sequences (old log-probs, ref log-probs, values, RM)."""

    role: str
    pool_gpus: int
    sp_size: int
    dp_size: Q
    sequences_per_gpu: Q
    use_dynamic_bsz: bool
    micro_batch_size_per_gpu: Q | None  # None with use_dynamic_bsz
    micro_batches_per_gpu: Q | None
    max_token_len_per_gpu: Q
    tokens_per_micro_batch: Q  # ulysses splits a sequence across sp ranks: budget × sp
    micro_key: str  # the config key the micro batch came from (for diagnostics)
    deprecated_micro: int | None = None


class TrainPass(NamedTuple):
    """A training role's update: mini batches, micro batches, accumulation, optimizer steps."""

    role: str
    pool_gpus: int
    sp_size: int
    dp_size: Q
    ppo_mini_batch_size: int
    sequences_per_gpu: Q
    ppo_mini_batch_size_per_gpu: Q
    use_dynamic_bsz: bool
    ppo_micro_batch_size_per_gpu: Q | None
    grad_accum_steps: Q | None
    mini_batches_per_epoch: Q
    ppo_epochs: int
    optimizer_steps_per_train_step: Q
    max_token_len_per_gpu: Q
    tokens_per_micro_batch: Q
    deprecated_micro: int | None = None


class RolloutPlan(NamedTuple):
    backend: str
    pool_gpus: int
    tensor_parallel_size: int
    replicas: Q
    n: int
    prompts_per_step: int
    sequences_per_step: Q
    prompts_per_generation: Q  # data.gen_batch_size, or train_batch_size when unset: one generation round
    sequences_per_generation: Q
    sequences_per_replica: Q  # of one generation round
    prompt_length: Q
    response_length: Q
    max_model_len: Q
    log_prob: ForwardPass  # the old-log-prob pass's sizes (validated even when `old_log_probs` skips it)
    old_log_probs: str  # where π_old comes from: "recompute", "update" or "rollout" (old_log_prob_source)
    old_log_probs_why: str
    log_probs: bool  # the engine returns each sampled token's log-prob (rollout_log_prob_need)
    log_probs_why: str


class Schedule(NamedTuple):
    """How generation and training share time (rlconf explain's `schedule`, the engine's choice of loop)."""

    # "colocated_sync": the stages take turns on one pool; "one_step_off_policy": a rollout pool of its own, one
    # batch ahead; "fully_async": that pool streams groups into a bounded queue the trainer takes from
    mode: str
    why: str
    max_staleness: int  # training steps between the weights a step trains and the weights that generated its groups
    weight_sync: str  # "in_process" (the actor's own rollout copy), "nccl" (GPU pools) or "gloo" (CPU pools)
    bucket_megabytes: int  # checkpoint_engine.update_weights_bucket_megabytes: the most one broadcast carries
    trainer_gpus: int
    rollout_gpus: int  # the rollout pool's GPUs (the trainer's when colocated)
    total_gpus: int  # every pool's: trainer.* plus, with verl's rollout.nnodes, the rollout pool on top (and a served
    # reward model's own pool: `normalize` adds it, reward_model.nnodes × n_gpus_per_node)
    # fully_async only (verl's async_training.*; 0 elsewhere):
    sync_every: int = 1  # trigger_parameter_sync_step: trainer steps between two weight pushes
    groups_per_step: int = 0  # verl's required_samples: ppo_mini_batch_size × require_batches groups per trainer step
    max_groups_per_version: int = 0  # verl's max_required_samples: groups started per weight version
    replica_share: int = 0  # the most groups one rollout replica generates per trainer step
    replica_window: int = 0  # concurrent_samples_per_replica: groups a replica's engine holds at once (RL371 below share)
    # verl's partial_rollout: a push interrupts the pool's calls and their unfinished responses resume on the new
    # weights (a response's tokens may then come from several versions; its group's staleness counts from the first)
    partial_rollout: bool = False
    formulas: dict[str, str] = {}


def fully_async_sizes(plan: PlanConfig, replicas: int) -> dict[str, Any]:
    """verl's fully async arithmetic (FullyAsyncRollouter): the groups a trainer step takes, the groups the pool may
    start per weight version (counting those still queued at the push), and the staleness that bound allows.

    Staleness: a group started under version v (pushed after step v) waits behind at most
    max_groups_per_version − 1 others, taken groups_per_step a step; so it is trained by step v + ⌈max ÷ per step⌉
    at the latest, on weights at most ⌈max ÷ per step⌉ − 1 steps newer than its own.
    """
    cfg = plan.async_training
    required = plan.actor_rollout_ref.actor.ppo_mini_batch_size * cfg.require_batches
    share = -(-required // max(replicas, 1))  # the most a replica generates of a step (shares differ by one at most)
    window = cfg.concurrent_samples_per_replica
    max_groups = int(required * (1 + cfg.staleness_threshold) * cfg.trigger_parameter_sync_step)
    staleness = max(math.ceil(max_groups / required) - 1, 0)
    return {
        "groups_per_step": required, "max_groups_per_version": max_groups,
        "replica_share": share, "replica_window": window,
        "max_staleness": staleness, "sync_every": cfg.trigger_parameter_sync_step,
        "partial_rollout": cfg.partial_rollout,
        "formulas": {
            "groups_per_step": f"ppo_mini_batch_size {plan.actor_rollout_ref.actor.ppo_mini_batch_size} × "
                               f"require_batches {cfg.require_batches} = {required}",
            "replica_window": f"concurrent_samples_per_replica {window}: groups a rollout replica's engine holds at "
                              f"once, of its {share} a step",
            "max_groups_per_version": f"⌊{required} × (1 + staleness_threshold {cfg.staleness_threshold:g}) × "
                                      f"trigger_parameter_sync_step {cfg.trigger_parameter_sync_step}⌋ = {max_groups}",
            "max_staleness": f"⌈{max_groups} ÷ {required}⌉ − 1 = {staleness} steps",
        },
    }


def schedule(plan: PlanConfig, where: Placement) -> Schedule:
    """verl 0.9.1 picks its trainer by entry point; rlconf by the same keys that trainer asserts:
    `hybrid_engine: false` with rollout on a pool of its own is the one-step off-policy schedule
    (verl experimental/one_step_off_policy: `assert not self.hybrid_engine`), or the fully async one when the
    plan writes verl's `async_training` section (read only by experimental/fully_async_policy)."""
    arr = plan.actor_rollout_ref
    actor, rollout = where.pool_of("actor"), where.pool_of("rollout")
    trainer_gpus = actor.gpus if actor else 0
    bucket = arr.rollout.checkpoint_engine.update_weights_bucket_megabytes
    apart = actor is not None and rollout is not None and actor.name != rollout.name
    if arr.hybrid_engine or not apart:
        return Schedule("colocated_sync", "hybrid_engine: rollout shares the actor's GPUs and the stages take turns",
                        0, "in_process", bucket, trainer_gpus, trainer_gpus, where.cluster_gpus)
    backend = "nccl" if plan.trainer.device == "cuda" else "gloo"
    if plan.async_training is not None:
        sizes = fully_async_sizes(plan, max(rollout.gpus // arr.rollout.tensor_model_parallel_size, 1))
        return Schedule("fully_async",
                        f"hybrid_engine false, rollout on pool `{rollout.name}` and an `async_training` section: the "
                        "pool streams groups while the trainer trains (verl's fully async trainer)",
                        sizes.pop("max_staleness"), backend, bucket, trainer_gpus, rollout.gpus, where.cluster_gpus,
                        **sizes)
    return Schedule("one_step_off_policy",
                    f"hybrid_engine false, rollout on pool `{rollout.name}`: step k+1's batch is generated while step k "
                    "trains (verl's one-step off-policy trainer)", 1, backend, bucket, trainer_gpus, rollout.gpus,
                    where.cluster_gpus)


def _with_reward_pool(sched: Schedule, served: ServedRewardModel | None) -> Schedule:
    """The run's GPUs counted once, here: a served reward model on its own pool (verl's reward_pool) adds its GPUs."""
    if served is None or served.colocated:
        return sched
    return sched._replace(total_gpus=sched.total_gpus + served.pool_gpus)


class Normalized(NamedTuple):
    placement: Placement
    rollout_n: int
    sequences_per_step: Q
    rollout: RolloutPlan
    actor: TrainPass
    ref: ForwardPass | None  # None where the role does not run
    critic: TrainPass | None
    critic_values: ForwardPass | None
    reward_model: ForwardPass | None  # the FSDP reward-model worker's pass
    roles: list[str]
    schedule: Schedule
    served_reward_model: ServedRewardModel | None = None  # the reward loop's served reward model (rlconf.reward_loop)


# --- the arithmetic ---------------------------------------------------------------------------


def _dp(pool_gpus: int, sp: int) -> Q:
    return divide(pool_gpus, sp, f"{pool_gpus} GPUs ÷ sp {sp}")


def _micro(per_gpu: int | None, deprecated: int | None, dp: Q, key: str) -> Q | None:
    """verl's rule: a deprecated global micro batch is divided by the data-parallel size."""
    if per_gpu is not None:
        return given(per_gpu, f"{key}_per_gpu")
    if deprecated is not None:
        return divide(deprecated, dp.value, f"{key.rpartition('.')[2]} {deprecated} ÷ dp {dp.value}")
    return None


def _forward_pass(role: str, pool_gpus: int, sp: int, sequences: int, dynamic: bool,
                  per_gpu: int | None, deprecated: int | None, max_tokens: Q, key: str) -> ForwardPass:
    dp = _dp(pool_gpus, sp)
    seqs = divide(sequences, dp.value, f"{sequences} sequences ÷ dp {dp.value}")
    micro = None if dynamic else _micro(per_gpu, deprecated, dp, key)
    count = None
    if micro is not None and micro.value and seqs.value is not None:
        batches = math.ceil(seqs.value / micro.value)
        count = Q(batches, f"⌈{seqs.value} ÷ {micro.value}⌉ = {batches}")
    tokens = Q(max_tokens.value * sp if max_tokens.value else None,
               f"{max_tokens.value} × sp {sp} = {max_tokens.value * sp if max_tokens.value else None}")
    return ForwardPass(role, pool_gpus, sp, dp, seqs, dynamic, micro, count, max_tokens, tokens, key,
                       deprecated if per_gpu is None else None)


def _train_pass(role: str, pool_gpus: int, sp: int, train_batch: int, n: int, mini: int, epochs: int,
                dynamic: bool, per_gpu: int | None, deprecated: int | None, max_tokens: Q, key: str) -> TrainPass:
    dp = _dp(pool_gpus, sp)
    seqs = divide(train_batch * n, dp.value, f"{train_batch} × n {n} ÷ dp {dp.value}")
    mini_gpu = divide(mini * n, dp.value, f"{mini} × n {n} ÷ ({pool_gpus} GPUs ÷ sp {sp})")
    micro = None if dynamic else _micro(per_gpu, deprecated, dp, key)
    accum = None
    if micro is not None:
        accum = divide(mini_gpu.value, micro.value, f"{mini_gpu.value} ÷ {micro.value}")
    minis = divide_up(train_batch, mini, f"{train_batch} ÷ {mini}")
    steps_value = epochs * minis.value if minis.value is not None else None
    steps = Q(steps_value, f"ppo_epochs {epochs} × {minis.value} mini batches = {steps_value}", minis.exact)
    tokens = Q(max_tokens.value * sp, f"{max_tokens.value} × sp {sp} = {max_tokens.value * sp}")
    return TrainPass(role, pool_gpus, sp, dp, mini, seqs, mini_gpu, dynamic, micro, accum, minis, epochs, steps,
                     max_tokens, tokens, deprecated if per_gpu is None else None)


# Estimators whose advantages read π_old's log-probs, so they must exist before the update.
ESTIMATORS_READING_OLD_LOG_PROBS: frozenset[str] = frozenset({"optimal_token_baseline", "tir_optimal_token_baseline"})


def old_log_prob_source(plan: PlanConfig, actor: TrainPass) -> tuple[str, str]:
    """Where the PPO ratio's π_old comes from, and why (shown by `rlconf explain`).

    - "rollout": algorithm.rollout_correction.bypass_mode, verl's bypass mode: the rollout engine's
      own log-probs stand in for π_old; no forward pass.
    - "update": the update is one optimizer step, so its forward runs at π_old's weights and its
      detached log-probs *are* π_old's (verl's dp_actor uses them so when on-policy); the separate
      forward pass over the batch is skipped, unless something reads π_old before the update.
    - "recompute": a forward pass of the actor over the batch before the update (verl's default).
    """
    if plan.algorithm.rollout_correction.bypass_mode:
        return "rollout", "rollout_correction.bypass_mode: the rollout engine's log-probs (verl's bypass mode)"
    steps = actor.optimizer_steps_per_train_step
    if steps.value != 1:
        return "recompute", f"{steps.formula} optimizer steps: π_old must be fixed before the first"
    readers = []
    if plan.algorithm.use_kl_in_reward:
        readers.append("algorithm.use_kl_in_reward")
    if plan.algorithm.adv_estimator in ESTIMATORS_READING_OLD_LOG_PROBS:
        readers.append(f"adv_estimator {plan.algorithm.adv_estimator}")
    correction = plan.algorithm.rollout_correction
    if correction.rollout_rs is not None:  # its rejections rewrite the response mask the advantages read
        readers.append("rollout_correction.rollout_rs")
    if correction.rollout_is is not None and correction.rollout_is_batch_normalize:  # one mean over the whole batch
        readers.append("rollout_correction.rollout_is_batch_normalize")
    if plan.trainer.critic_warmup > 0 and plan.algorithm.adv_estimator == "gae":
        readers.append(f"critic_warmup {plan.trainer.critic_warmup} (steps without an actor update)")
    if readers:
        return "recompute", f"one optimizer step, but {' and '.join(readers)} read π_old before the update"
    return "update", (f"{steps.formula} optimizer step: the update's forward runs at π_old's weights, so its "
                      "detached log-probs are π_old's")


def rollout_log_prob_need(plan: PlanConfig, old_source: str) -> tuple[bool, str]:
    """Whether the rollout engine returns each sampled token's log-prob, and why (shown by `rlconf explain`).

    verl's rollout.calculate_log_probs (true by default in its rollout.yaml) asks for them; where it is false,
    rlconf still returns them if the algorithm reads them (verl 0.9.1 would then train without rollout_is or
    rollout_rs, or raise in bypass mode: RL553 says so). Off, the engine samples without them: vLLM then computes
    no log-softmax of the processed logits and hands no log-prob per token and request through its output
    processor on each decode step.
    """
    readers = []
    if old_source == "rollout":
        readers.append("rollout_correction.bypass_mode (they are π_old)")
    correction = plan.algorithm.rollout_correction
    if correction.rollout_is is not None:
        readers.append("rollout_correction.rollout_is")
    if correction.rollout_rs is not None:
        readers.append("rollout_correction.rollout_rs")
    if readers:
        return True, f"{' and '.join(readers)} read them"
    if plan.actor_rollout_ref.rollout.calculate_log_probs:
        return True, "rollout.calculate_log_probs true: the rollout/trainer gap metrics read them"
    return False, "rollout.calculate_log_probs false and nothing else reads them"


def generation_batch(gen_batch_size: int | None, train_batch_size: int) -> Q:
    """Prompts one generation round draws from the data (verl: `data.get("gen_batch_size",
    train_batch_size)`, the train dataloader's batch size). DAPO's group filter runs rounds of this
    size until train_batch_size groups are kept; without it the two must be equal (RL524)."""
    if gen_batch_size is None:
        return Q(train_batch_size, f"train_batch_size = {train_batch_size} (gen_batch_size unset)")
    return given(gen_batch_size, "data.gen_batch_size")


def _inherit(value, fallback, own: str, parent: str) -> Q:
    if value is not None:
        return given(value, own)
    return Q(fallback, f"{parent} = {fallback}")


def normalize(plan: PlanConfig) -> Normalized:
    arr = plan.actor_rollout_ref
    actor, rollout, ref, critic, rm = arr.actor, arr.rollout, arr.ref, plan.critic, plan.reward_model
    where = placement(plan)
    n = rollout.n
    train = plan.data.train_batch_size
    sequences = train * n
    seq_q = Q(sequences, f"train_batch_size {train} × n {n} = {sequences}")

    def gpus(role: str) -> int:
        pool = where.pool_of(role)
        return pool.gpus if pool else 0

    actor_tokens = given(actor.ppo_max_token_len_per_gpu, "actor.ppo_max_token_len_per_gpu")
    actor_pass = _train_pass("actor", gpus("actor"), actor.ulysses_sequence_parallel_size, train, n,
                             actor.ppo_mini_batch_size, actor.ppo_epochs, actor.use_dynamic_bsz,
                             actor.ppo_micro_batch_size_per_gpu, actor.ppo_micro_batch_size, actor_tokens,
                             "actor_rollout_ref.actor.ppo_micro_batch_size")

    # Old log-probs are recomputed by the actor's model in the actor's pool, with the actor's sp.
    log_prob = _forward_pass(
        "rollout", gpus("actor"), actor.ulysses_sequence_parallel_size, sequences,
        rollout.log_prob_use_dynamic_bsz if rollout.log_prob_use_dynamic_bsz is not None else actor.use_dynamic_bsz,
        rollout.log_prob_micro_batch_size_per_gpu, rollout.log_prob_micro_batch_size,
        _inherit(rollout.log_prob_max_token_len_per_gpu, actor.ppo_max_token_len_per_gpu,
                 "rollout.log_prob_max_token_len_per_gpu", "actor.ppo_max_token_len_per_gpu"),
        "actor_rollout_ref.rollout.log_prob_micro_batch_size")

    prompt_len = _inherit(rollout.prompt_length, plan.data.max_prompt_length, "rollout.prompt_length", "data.max_prompt_length")
    response_len = _inherit(rollout.response_length, plan.data.max_response_length, "rollout.response_length",
                            "data.max_response_length")
    model_len = (given(rollout.max_model_len, "rollout.max_model_len") if rollout.max_model_len is not None else
                 Q(prompt_len.value + response_len.value,
                   f"prompt {prompt_len.value} + response {response_len.value} = {prompt_len.value + response_len.value}"))
    tp = rollout.tensor_model_parallel_size
    replicas = divide(gpus("rollout"), tp, f"{gpus('rollout')} GPUs ÷ tp {tp}")
    generation = generation_batch(plan.data.gen_batch_size, train)
    old_source = old_log_prob_source(plan, actor_pass)
    gen_sequences = generation.value * n
    rollout_plan = RolloutPlan(
        rollout.name, gpus("rollout"), tp, replicas, n, train, seq_q, generation,
        Q(gen_sequences, f"{generation.value} prompts × n {n} = {gen_sequences}"),
        divide(gen_sequences, replicas.value, f"{gen_sequences} sequences ÷ {replicas.value} replicas"),
        prompt_len, response_len, model_len, log_prob, *old_source,
        *rollout_log_prob_need(plan, old_source[0]))

    ref_pass = None
    if "ref" in where.roles:
        ref_sp = ref.ulysses_sequence_parallel_size or actor.ulysses_sequence_parallel_size
        ref_pass = _forward_pass(
            "ref", gpus("ref"), ref_sp, sequences,
            ref.log_prob_use_dynamic_bsz if ref.log_prob_use_dynamic_bsz is not None else actor.use_dynamic_bsz,
            ref.log_prob_micro_batch_size_per_gpu, ref.log_prob_micro_batch_size,
            _inherit(ref.log_prob_max_token_len_per_gpu, actor.ppo_max_token_len_per_gpu,
                     "ref.log_prob_max_token_len_per_gpu", "actor.ppo_max_token_len_per_gpu"),
            "actor_rollout_ref.ref.log_prob_micro_batch_size")

    critic_pass = critic_values = None
    critic_dynamic = critic.use_dynamic_bsz if critic.use_dynamic_bsz is not None else actor.use_dynamic_bsz
    critic_fwd_tokens = _inherit(critic.forward_max_token_len_per_gpu, critic.ppo_max_token_len_per_gpu,
                                 "critic.forward_max_token_len_per_gpu", "critic.ppo_max_token_len_per_gpu")
    if "critic" in where.roles:
        sp = critic.ulysses_sequence_parallel_size
        critic_pass = _train_pass(
            "critic", gpus("critic"), sp, train, n, critic.ppo_mini_batch_size or actor.ppo_mini_batch_size,
            critic.ppo_epochs or actor.ppo_epochs, critic_dynamic, critic.ppo_micro_batch_size_per_gpu,
            critic.ppo_micro_batch_size, given(critic.ppo_max_token_len_per_gpu, "critic.ppo_max_token_len_per_gpu"),
            "critic.ppo_micro_batch_size")
        # verl: forward_micro_batch_size(_per_gpu) defaults to the ppo micro batch.
        fwd_per_gpu = critic.forward_micro_batch_size_per_gpu
        fwd_deprecated = critic.forward_micro_batch_size
        if fwd_per_gpu is None and fwd_deprecated is None:
            fwd_per_gpu, fwd_deprecated = critic.ppo_micro_batch_size_per_gpu, critic.ppo_micro_batch_size
        critic_values = _forward_pass("critic", gpus("critic"), sp, sequences, critic_dynamic, fwd_per_gpu,
                                      fwd_deprecated, critic_fwd_tokens, "critic.forward_micro_batch_size")

    rm_pass = None
    if "reward_model" in where.roles:
        # verl 0.9's reward loop batches by itself, so its plans set no micro batch: rlconf's FSDP scorer then
        # fills micro batches up to the token budget, as with dynamic batch size.
        rm_micro_unset = rm.micro_batch_size_per_gpu is None and rm.micro_batch_size is None
        rm_pass = _forward_pass(
            "reward_model", gpus("reward_model"), rm.ulysses_sequence_parallel_size, sequences,
            (rm.use_dynamic_bsz if rm.use_dynamic_bsz is not None else critic_dynamic) or rm_micro_unset,
            rm.micro_batch_size_per_gpu, rm.micro_batch_size,
            _inherit(rm.forward_max_token_len_per_gpu, critic_fwd_tokens.value,
                     "reward_model.forward_max_token_len_per_gpu", "critic.forward_max_token_len_per_gpu"),
            "reward_model.micro_batch_size")

    actor_pool = where.roles.get("actor", "global")
    served = served_reward_model(plan, actor_pool, gpus("actor"))
    return Normalized(where, n, seq_q, rollout_plan, actor_pass, ref_pass, critic_pass, critic_values, rm_pass,
                      roles=list(where.roles), schedule=_with_reward_pool(schedule(plan, where), served),
                      served_reward_model=served)


def is_group_estimator(plan: PlanConfig) -> bool:
    return plan.algorithm.adv_estimator in GROUP_ESTIMATORS
