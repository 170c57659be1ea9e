"""A step's stages as named units: each takes the step's batch (or samples) and returns what it adds.

The synchronous loop (engine/trainer.py) calls them in order; each one talks to a worker group
through `Dispatch` and holds no state of its own between steps, so an overlapped schedule can call
`generate` and `score` for step k+1 while `update_actor` runs for step k. Stages that add fields to
the batch return them (the caller merges), stages that only measure return metrics.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from engine.algos.advantages import masked_mean, outcome_token_scores
from engine.algos.kl import AdaptiveKLController, FixedKLController
from engine.algos.rollout_correction import (log_prob_gap_metrics, normalize_is_weights, rejection_mask,
                                             rollout_is_metrics, rollout_is_weights)
from engine.batch import TensorBatch
from engine.controller.advantages import compute_advantages, kl_in_reward, value_metrics
from engine.controller.dispatch import Dispatch, mean_over_ranks
from engine.controller.samples import StepInputs
from engine.dynamic_sampling import collect_groups
from engine.rewards.managers import RewardManager, Responses
from engine.rewards.retemplate import ChatTemplateSwitch, RewardLoopPrompts, worker_rows
from engine.rollout.replicas import generate_on_replicas
from engine.validation import generate_sharded
from rlconf.resolved import ResolvedPlan

# The critic trains on these fields of a step's batch; the rest stays on the controller.
CRITIC_UPDATE_FIELDS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "values",
                        "returns")

Scored = tuple[StepInputs, TensorBatch, list[float], torch.Tensor]  # samples, rollout, scores, scores + penalties


@dataclass
class StepStages:
    resolved: ResolvedPlan
    actor: Any  # the actor + rollout + ref worker group (RayWorkerGroup or LocalWorkerGroup)
    critic: Any  # the critic's worker group, or None
    rewards: RewardManager  # reward_model.reward_manager over the plan's scorer (engine.rewards.managers)
    decode: Callable[[TensorBatch], list[str]]  # response token ids -> text
    kl_controller: FixedKLController | AdaptiveKLController | None = None  # algorithm.use_kl_in_reward
    # the reward model's worker group (reward_model.enable): FSDP workers, or one served replica each
    # (resolved.roles.served_reward_model, verl 0.9.1's reward loop); None without a reward model
    reward_model: Any = None
    # The reward model reads each row re-rendered in its own chat template: the FSDP worker with
    # reward_model.model.input_tokenizer (ChatTemplateSwitch), a served one always (RewardLoopPrompts)
    rm_inputs: ChatTemplateSwitch | RewardLoopPrompts | None = None

    def __post_init__(self) -> None:
        self.dispatch = Dispatch(self.resolved.config.trainer.balance_batch)

    # --- producer side: prompts -> scored responses ---------------------------------------------------

    def generate(self, prompts: TensorBatch) -> TensorBatch:
        """Rollout over every replica; the `rollout_log_probs` a backend returns stay only for the metrics."""
        rollout = self.resolved.roles.rollout
        return generate_on_replicas(self.actor, "generate", prompts, rollout.replicas, rollout.tensor_parallel_size,
                                    self.dispatch.balanced_order(prompts, rollout.replicas))

    def score(self, samples: StepInputs, batch: TensorBatch) -> tuple[list[float], torch.Tensor]:
        """(the scorer's score per response, the score the advantages see: plus the dapo overlong penalty).

        With a reward model its scores are the reward, as in verl: its reward managers return the
        model's scores as they are when there are any, without calling the rule scorer or adding a penalty.
        Without one, the plan's reward manager (naive, dapo, batch or prime) scores the decoded responses.
        """
        if self.reward_model is not None:
            scores_t = self.reward_model_scores(batch, samples.raw_prompts)
            return scores_t.tolist(), scores_t
        return self.rewards(Responses(self.decode(batch), samples.data_sources, samples.ground_truths,
                                      samples.extra_infos, batch["response_mask"].sum(-1)))

    def filter_groups(self, first: Scored, draw: Callable[[], StepInputs], first_group_id: int
                      ) -> tuple[StepInputs, TensorBatch, torch.Tensor, dict[str, float]]:
        """DAPO dynamic sampling: keep the groups whose responses differ, generate more batches of prompts
        (`draw` gives data.gen_batch_size each, as the first) until train_batch_size groups are kept,
        train on exactly those (engine.dynamic_sampling)."""
        config = self.resolved.config

        def next_round() -> Scored:
            more = draw()
            generated = self.generate(more.prompts)
            return (more, generated, *self.score(more, generated))

        return collect_groups(first, next_round, config.algorithm.filter_groups.metric, config.data.train_batch_size,
                              config.algorithm.filter_groups.max_num_gen_batches, first_group_id=first_group_id)

    def reward_model_scores(self, batch: TensorBatch, raw_prompts: list[list[dict[str, Any]]] | None = None
                            ) -> torch.Tensor:
        """[B] fp32: the reward model's score of each (prompt, response) row, at its last token: the policy's
        own rows, or with input_tokenizer each row re-rendered in the reward model's chat template (verl)."""
        if self.resolved.roles.served_reward_model is not None:
            return self.served_reward_model_scores(batch, raw_prompts or [])
        role = self.resolved.roles.reward_model
        if self.rm_inputs is not None:
            rows = worker_rows(self.rm_inputs.verl_rows(raw_prompts or [], batch["responses"], batch["attention_mask"]))
        else:
            fields = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask")
            rows = {name: batch[name] for name in fields}
        return self.dispatch.sharded_any_rows(self.reward_model, "compute_rm_score", rows, role.dp_size)["rm_scores"]

    def served_reward_model_scores(self, batch: TensorBatch, raw_prompts: list[list[dict[str, Any]]]) -> torch.Tensor:
        """[B] fp32: verl 0.9.1's reward loop. Each row's chat re-rendered as text (RewardLoopPrompts), the texts
        split into contiguous chunks, one per served replica (as verl chunks the batch over its reward loop
        workers), each replica's scores back in row order."""
        if not isinstance(self.rm_inputs, RewardLoopPrompts):
            raise RuntimeError("a served reward model scores rendered texts, and the stages were given no "
                               "RewardLoopPrompts (engine.trainer.reward_model_inputs builds them)")
        texts = self.rm_inputs.texts(raw_prompts, batch["responses"], batch["attention_mask"])
        replicas = self.resolved.roles.served_reward_model.replicas
        size, extra = divmod(len(texts), replicas)  # the first `extra` replicas take one text more
        bounds = [r * size + min(r, extra) for r in range(replicas + 1)]
        chunks = [texts[bounds[r]:bounds[r + 1]] for r in range(replicas)]
        per_replica = self.reward_model.call_sharded("compute_rm_score", chunks)
        return torch.tensor([score for scores in per_replica for score in scores], dtype=torch.float32)

    def served_reward_model_timings(self) -> dict[str, float]:
        """The served reward model's own seconds (wake, score, sleep) since the last call, slowest replica."""
        per_replica = self.reward_model.call_all("timings")
        keys = sorted({key for timings in per_replica for key in timings})
        return {(f"memory/reward_model_{key}" if key.endswith("_gb") else f"timing/reward_model_{key}"):
                max(t.get(key, 0.0) for t in per_replica) for key in keys}

    def greedy_baselines(self, samples: StepInputs) -> torch.Tensor:
        """ReMax: the reward of each prompt's greedy response, repeated for its n samples ([B])."""
        rollout = self.resolved.roles.rollout
        firsts = slice(None, None, rollout.n)  # samples of a prompt are adjacent: every n-th row is one prompt each
        prompts = {name: value[firsts] for name, value in samples.prompts.items()}
        out = generate_sharded(self.actor, prompts, rollout.replicas, rollout.tensor_parallel_size, "generate_greedy")
        greedy = StepInputs(prompts, samples.group_ids[firsts], samples.data_sources[firsts],
                            samples.ground_truths[firsts], samples.extra_infos[firsts], samples.raw_prompts[firsts])
        return self.score(greedy, out)[1].repeat_interleave(rollout.n)  # the reward the sampled responses get

    # --- consumer side: scored responses -> updates -------------------------------------------------

    def old_log_probs(self, batch: TensorBatch) -> tuple[TensorBatch, dict[str, float], dict[str, float]]:
        """π_old recomputed by the actor: (fields, rollout-correction metrics, the sampling policy's entropy)."""
        fields = self.dispatch.sharded(self.actor, "compute_log_prob", batch, self.resolved.roles.rollout.log_prob.dp_size)
        # The sampling policy's entropy is a metric only: it stays on the controller.
        entropy = {"actor/entropy": float(masked_mean(fields.pop("entropy"), batch["response_mask"]))}
        metrics: dict[str, float] = {}
        if "rollout_log_probs" in batch:
            metrics.update(log_prob_gap_metrics(fields["old_log_probs"], batch["rollout_log_probs"],
                                                batch["response_mask"]))
        correction = self.resolved.config.algorithm.rollout_correction
        if correction.rollout_is is not None:
            weights = rollout_is_weights(fields["old_log_probs"], batch["rollout_log_probs"], batch["response_mask"],
                                         correction.rollout_is, correction.rollout_is_threshold)
            metrics.update(rollout_is_metrics(weights, batch["response_mask"], correction.rollout_is_threshold))
            if correction.rollout_is_batch_normalize:  # over the whole step's batch, as verl's trainer does
                weights, factor = normalize_is_weights(weights, batch["response_mask"], correction.rollout_is)
                metrics["rollout_corr/rollout_is_batch_norm_factor"] = float(factor)
            fields["rollout_is_weights"] = weights
        return fields, metrics, entropy

    def ref_log_probs(self, batch: TensorBatch) -> TensorBatch:
        return self.dispatch.sharded(self.actor, "compute_ref_log_prob", batch, self.resolved.roles.ref.dp_size)

    def values(self, batch: TensorBatch) -> TensorBatch:
        return self.dispatch.sharded(self.critic, "compute_values", batch, self.resolved.roles.critic_values.dp_size)

    def advantages(self, samples: StepInputs, batch: TensorBatch, scores: torch.Tensor,
                   reward_baselines: torch.Tensor | None) -> tuple[TensorBatch, dict[str, float]]:
        """Token rewards (minus β·KL when the plan puts KL in the reward) -> advantages (and returns).

        With rollout_rs (outside bypass mode) the fields hold the response mask without the rejected tokens."""
        config, metrics = self.resolved.config, {}
        token_rewards = outcome_token_scores(scores, batch["response_mask"])
        if self.kl_controller is not None:
            token_rewards, kl_metrics = kl_in_reward(self.kl_controller, token_rewards, batch,
                                                     config.algorithm.kl_penalty)
            metrics.update(kl_metrics)
        fields: TensorBatch = {}
        checks = config.algorithm.rollout_correction.rejection_checks()
        if checks and self.resolved.roles.rollout.old_log_probs != "rollout":
            # verl: after the reward (at the true last token) and its KL penalty, before advantages, critic and actor.
            fields["response_mask"], rs_metrics = rejection_mask(batch["old_log_probs"] - batch["rollout_log_probs"],
                                                                 batch["response_mask"], checks)
            metrics.update(rs_metrics)
            batch = {**batch, **fields}
        fields.update(compute_advantages(config.algorithm, token_rewards, samples.group_ids, batch, reward_baselines))
        if self.critic is not None:
            metrics.update(value_metrics({**batch, **fields}))
        return fields, metrics

    def update_critic(self, batch: TensorBatch) -> dict[str, float]:
        critic_batch = {name: batch[name] for name in CRITIC_UPDATE_FIELDS}
        shards = self.dispatch.shards(critic_batch, self.resolved.roles.critic.dp_size, self.critic)
        return mean_over_ranks(self.critic.call_sharded("update_critic", shards))

    def update_actor(self, batch: TensorBatch) -> dict[str, float]:
        shards = self.dispatch.shards(batch, self.resolved.roles.actor.dp_size, self.actor)
        return mean_over_ranks(self.actor.call_sharded("update_actor", shards))

    def sync_weights(self) -> dict[str, float]:
        """The actor's new weights into its rollout copies."""
        # Worker-side seconds exclude the Ray round trip that timing/weight_sync includes.
        return {"timing/weight_sync_in_worker": max(self.actor.call_all("sync_rollout_weights"))}

    def rollout_timings(self) -> dict[str, float]:
        """The rollout backend's own seconds (wake, generate, sleep, weight load), slowest rank; its device use, max."""
        return rollout_backend_metrics(self.actor.call_all("rollout_timings"))


def rollout_backend_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Each rank's rollout backend `timings()` as metrics: timing/rollout_<key> (seconds) and memory/rollout_<key>
    (`*_gb`), the largest rank's value of each (docs/metrics.md)."""
    keys = sorted({key for timings in per_rank for key in timings})
    metrics = {(f"memory/rollout_{k}" if k.endswith("_gb") else f"timing/rollout_{k}"):
               max(t.get(k, 0.0) for t in per_rank) for k in keys}
    # Replicas generate side by side and the step waits for the slowest: the fastest one's seconds beside it
    # tell the wait for a slower replica apart from replicas that are all slower (weak scaling on several GPUs).
    generated = [t["generate_in_worker"] for t in per_rank if "generate_in_worker" in t]
    if len(generated) > 1:
        metrics["timing/rollout_generate_in_worker_min"] = min(generated)
    return metrics
