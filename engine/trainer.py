"""The single controller: one GRPO or PPO training step after another, reading top to bottom.

The controller holds the data, the rewards and the KL controller; workers hold the models. Each step:
prompts -> n samples each -> generate -> decode + reward -> old log-probs -> (ref log-probs)
-> (critic values) -> token rewards (minus β·KL if the plan puts KL in the reward) -> advantages
(group-relative, or GAE with the critic) -> (critic update) -> actor update (after the critic
warmup) -> push weights to the rollout copy -> metrics.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.algos.advantages import (
    compute_gae,
    compute_gpg_advantages,
    compute_grpo_advantages,
    compute_grpo_passk_advantages,
    compute_opo_advantages,
    compute_optimal_token_baseline_advantages,
    compute_reinforce_plus_plus_advantages,
    compute_reinforce_plus_plus_baseline_advantages,
    compute_remax_advantages,
    compute_rloo_advantages,
    compute_tir_optimal_token_baseline_advantages,
    masked_mean,
    masked_var,
    masked_whiten,
    outcome_token_scores,
)
from engine.algos.kl import AdaptiveKLController, FixedKLController, apply_kl_in_reward
from engine.algos.rollout_correction import log_prob_gap_metrics, rollout_is_metrics, rollout_is_weights
from engine.checkpoint import (
    VAL_GENERATIONS_FILE,
    CheckpointError,
    export_hf_model,
    load_checkpoint,
    save_checkpoint,
    should_save,
)
from engine.data.dataset import BatchOrder, PromptBatch, PromptDataset, read_rows
from engine.data.sources import resolve_data_files
from engine.dynamic_sampling import collect_groups
from engine.interrupt import stop_point
from engine.loggers import MetricSink, close_all, open_sinks
from engine.metrics import MetricsFile, StageTimer, console_line, first_non_finite
from engine.models.loading import load_tokenizer, resolve_model_path
from engine.rewards.batch import reward_function, score_responses
from engine.rewards.overlong import dapo_penalties, overlong_metrics
from engine.validation import (
    load_validation_dataset,
    generate_sharded,
    pick_generations,
    run_validation,
    should_validate,
    validation_schedule,
)
from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker
from engine.batch import TensorBatch, balanced_order, batch_size, concat, select, split_even
from engine.rollout.replicas import generate_on_replicas
from engine.workers.roles.critic import CriticWorker
from engine.workers.cluster.profiling import profiled_step
from engine.workers.sequence.ulysses import one_per_group, shards_for_ranks
from rlconf.resolved import ResolvedPlan
from rlconf.schema.sections import AlgorithmConfig, KLControl


class NonFiniteError(RuntimeError):
    """A loss or gradient norm became NaN/inf; the run stops rather than train on garbage."""


# The critic trains on these fields of a step's batch; the rest stays on the controller.
CRITIC_UPDATE_FIELDS = ("input_ids", "attention_mask", "position_ids", "responses", "response_mask", "values",
                        "returns")


@dataclass
class StepInputs:
    """One step's prompts expanded to n samples each, with what the reward needs per sample."""

    prompts: TensorBatch
    group_ids: list[int]  # samples of the same prompt share an id (the GRPO group)
    data_sources: list[str]
    ground_truths: list[str]
    extra_infos: list[dict[str, Any]]


def expand_samples(batch: PromptBatch, n: int, step: int) -> StepInputs:
    def repeat(values: list[Any]) -> list[Any]:
        return [v for v in values for _ in range(n)]

    return StepInputs(
        prompts={"input_ids": batch.input_ids.repeat_interleave(n, dim=0),
                 "attention_mask": batch.attention_mask.repeat_interleave(n, dim=0)},
        group_ids=repeat([step * len(batch) + i for i in range(len(batch))]),
        data_sources=repeat(batch.data_sources),
        ground_truths=repeat(batch.ground_truths),
        extra_infos=repeat(batch.extra_infos),
    )


@dataclass
class Trainer:
    resolved: ResolvedPlan
    group: Any  # RayWorkerGroup or LocalWorkerGroup
    tokenizer: Any
    dataset: PromptDataset
    order: BatchOrder
    total_steps: int
    score_fn: Callable[..., Any]
    metrics_file: MetricsFile
    log: Callable[[str], None] = print
    history: list[dict[str, Any]] = field(default_factory=list)
    critic_group: Any = None  # the critic's workers (GAE plans), a group with its own process group
    kl_controller: FixedKLController | AdaptiveKLController | None = None  # β of algorithm.use_kl_in_reward
    profile_dir: Path | None = None  # where trainer.profile_steps traces go (engine.workers.cluster.profiling)
    sinks: list[MetricSink] = field(default_factory=list)  # trainer.logger's tensorboard / wandb (engine.loggers)
    val_dataset: PromptDataset | None = None  # data.val_files, when the plan validates (engine.validation)
    run_dir: Path | None = None  # checkpoints go to run_dir/checkpoints (engine.checkpoint); None: no checkpoints
    start_step: int = 0  # the last step already trained: set by load_checkpoint when a run resumes

    def train(self, on_step: Callable[[int], None] = lambda step: None) -> None:
        # A resumed run already has its step-0 line, and validating again would draw sampling RNG.
        # stop_point: where a Ctrl-C stops the run (engine.interrupt), after each stage; a step stopped
        # part-way is neither published nor checkpointed, and a checkpoint in progress completes first.
        if self.val_dataset is not None and self.resolved.config.trainer.val_before_train and self.start_step == 0:
            self.publish(0, {"step": 0, **self.validate(0)})  # the initial policy, as a step-0 line
            stop_point("validation before training")
        for step in range(self.start_step + 1, self.total_steps + 1):
            with profiled_step(self._worker_groups(), self.profile_dir, step,
                               self.resolved.config.trainer.profile_steps):
                metrics = self.step(step)
            if self.val_dataset is not None and should_validate(step, self.total_steps,
                                                                self.resolved.config.trainer.test_freq):
                metrics.update(self.validate(step))
                stop_point(f"validation (step {step})")
            self.history.append(metrics)
            self.publish(step, metrics)
            bad = first_non_finite(metrics, ("actor/pg_loss", "actor/loss", "actor/grad_norm", "critic/vf_loss",
                                             "critic/grad_norm"))
            if bad is not None:
                raise NonFiniteError(f"step {step}: {bad} is {metrics[bad]} (non-finite); stopping the run")
            if self.run_dir is not None and should_save(step, self.total_steps, self.resolved.config.trainer.save_freq):
                self.save_checkpoint(step)
                stop_point(f"the checkpoint of step {step}")
            on_step(step)
            stop_point(f"step {step}")

    def publish(self, step: int, metrics: dict[str, Any]) -> None:
        """metrics.jsonl and every trainer.logger sink get the step's metrics; `console` prints its line."""
        for sink in (self.metrics_file, *self.sinks):
            sink.write(step, metrics)
        if "console" in self.resolved.config.trainer.logger:
            self.log(console_line(step, self.total_steps, metrics))

    def validate(self, step: int = 0) -> dict[str, float]:
        """val/* metrics of the current policy on data.val_files (rollout.val_kwargs sampling).

        With trainer.log_val_generations N > 0, N samples go to val_generations.jsonl (one line each,
        with `step`) beside metrics.jsonl, and to the console when trainer.logger has it.
        """
        if self.val_dataset is None:
            raise RuntimeError("validate() called, but the plan has no validation set (data.val_files)")
        count = self.resolved.config.trainer.log_val_generations
        samples: list[tuple[str, str, float]] | None = [] if count > 0 else None
        metrics = run_validation(self.group, self.val_dataset, self._decode, self.score_fn, self.resolved,
                                 samples=samples, decode_prompts=self._decode_prompts)
        if samples:
            self._log_generations(step, pick_generations(samples, count))
        return metrics

    def _log_generations(self, step: int, picked: list[tuple[str, str, float]]) -> None:
        path = self.metrics_file.path.parent / VAL_GENERATIONS_FILE
        with path.open("a", encoding="utf-8") as out:
            for prompt, response, score in picked:
                out.write(json.dumps({"step": step, "prompt": prompt, "response": response, "score": score}) + "\n")
        if "console" in self.resolved.config.trainer.logger:
            for prompt, response, score in picked:
                self.log(f"[val step {step}] score={score:g} prompt={prompt!r} response={response!r}")

    def close(self) -> None:
        """Flush and close metrics.jsonl and the logger sinks (each, even if another fails)."""
        close_all([self.metrics_file, *self.sinks])

    def step(self, step: int) -> dict[str, Any]:
        roles, config = self.resolved.roles, self.resolved.config
        timer = StageTimer(after=lambda stage: stop_point(f"{stage} (step {step})"))
        step_start = time.perf_counter()

        with timer.stage("data"):
            samples = expand_samples(self.dataset.collate(self.order.next_indices()), roles.rollout.n, step)

        with timer.stage("generate"):
            batch = self._generate(samples.prompts)

        with timer.stage("reward"):
            scores, scores_t = self._score(samples, batch)

        sampling_metrics: dict[str, float] = {}
        if config.algorithm.filter_groups.enable:
            with timer.stage("filter_groups"):
                samples, batch, scores_t, sampling_metrics = self._filter_groups(step, samples, batch, scores, scores_t)
        overlong = {}
        penalties = dapo_penalties(config.reward_model, batch["response_mask"].sum(-1))
        if penalties is not None and config.reward_model.reward_kwargs.overlong_buffer_cfg.log:
            overlong = overlong_metrics(penalties)

        reward_baselines = None
        if config.algorithm.adv_estimator == "remax":
            with timer.stage("gen_max"):
                reward_baselines = self._greedy_baselines(samples, roles.rollout.n)

        rollout_metrics: dict[str, float] = {}
        entropy_metric: dict[str, float] = {}
        source = roles.rollout.old_log_probs
        if source == "rollout":  # bypass mode: π_rollout is π_old (a KL in the reward reads it too, as in verl)
            batch["old_log_probs"] = batch["rollout_log_probs"]
        elif source == "recompute":
            with timer.stage("old_log_prob"):
                batch.update(self._sharded("compute_log_prob", batch, roles.rollout.log_prob.dp_size))
                # The sampling policy's entropy is a metric only: it stays on the controller.
                entropy_metric["actor/entropy"] = float(masked_mean(batch.pop("entropy"), batch["response_mask"]))
                if "rollout_log_probs" in batch:
                    rollout_metrics.update(log_prob_gap_metrics(batch["old_log_probs"], batch["rollout_log_probs"],
                                                                batch["response_mask"]))
                correction = config.algorithm.rollout_correction
                if correction.rollout_is is not None:
                    weights = rollout_is_weights(batch["old_log_probs"], batch["rollout_log_probs"],
                                                 batch["response_mask"], correction.rollout_is,
                                                 correction.rollout_is_threshold)
                    batch["rollout_is_weights"] = weights
                    rollout_metrics.update(rollout_is_metrics(weights, batch["response_mask"],
                                                              correction.rollout_is_threshold))
        # "update": the actor's update measures π_old's entropy, gap and IS weights on its first pass.

        if roles.ref is not None:
            with timer.stage("ref"):
                batch.update(self._sharded("compute_ref_log_prob", batch, roles.ref.dp_size))

        if self.critic_group is not None:
            with timer.stage("values"):
                batch.update(self._sharded("compute_values", batch, roles.critic_values.dp_size, self.critic_group))

        advantage_metrics: dict[str, float] = {}
        with timer.stage("adv"):
            token_rewards = outcome_token_scores(scores_t, batch["response_mask"])
            if self.kl_controller is not None:
                token_rewards, kl_metrics = kl_in_reward(self.kl_controller, token_rewards, batch,
                                                         config.algorithm.kl_penalty)
                advantage_metrics.update(kl_metrics)
            batch.update(compute_advantages(config.algorithm, token_rewards, samples.group_ids, batch, reward_baselines))
            if self.critic_group is not None:
                advantage_metrics.update(value_metrics(batch))

        critic_metrics: dict[str, float] = {}
        if self.critic_group is not None:
            with timer.stage("update_critic"):
                critic_batch = {name: batch[name] for name in CRITIC_UPDATE_FIELDS}
                shards = self._shards(critic_batch, roles.critic.dp_size, self.critic_group)
                critic_metrics = self._mean_over_ranks(self.critic_group.call_sharded("update_critic", shards))

        actor_metrics: dict[str, float] = {}
        # During the critic warmup the policy stays put, so the critic first learns the values of a fixed policy.
        if self.critic_group is None or step > config.trainer.critic_warmup:
            with timer.stage("update_actor"):
                shards = self._shards(batch, roles.actor.dp_size, self.group)
                actor_metrics = self._mean_over_ranks(self.group.call_sharded("update_actor", shards))

            with timer.stage("weight_sync"):
                # Worker-side seconds exclude the Ray round trip that timing/weight_sync includes.
                actor_metrics["timing/weight_sync_in_worker"] = max(self.group.call_all("sync_rollout_weights"))
        rollout_metrics.update(self._rollout_timings())

        step_seconds = time.perf_counter() - step_start
        response_lengths = batch["response_mask"].sum(-1).float()
        tokens = int(batch["attention_mask"].sum())
        return {
            "step": step,
            "epoch": self.order.epoch,
            "reward/mean": float(scores_t.mean()),
            "reward/max": float(scores_t.max()),
            "reward/full_credit_fraction": float((scores_t >= 1.0).float().mean()),
            **overlong,
            **sampling_metrics,
            "response_length/mean": float(response_lengths.mean()),
            "response_length/clip_fraction": float((response_lengths >= roles.rollout.response_length).float().mean()),
            **entropy_metric,
            "perf/tokens": tokens,
            "perf/tokens_per_second": tokens / step_seconds,
            "perf/tokens_per_second_per_gpu": tokens / step_seconds / self.resolved.world.world_size,
            **rollout_metrics,
            **advantage_metrics,
            **critic_metrics,
            **actor_metrics,
            **timer.as_metrics(),
            "timing/step": step_seconds,
        }

    def _score(self, samples: StepInputs, batch: TensorBatch) -> tuple[list[float], torch.Tensor]:
        """(the scorer's score per response, the score the advantages see: plus the dapo overlong penalty)."""
        reward_model = self.resolved.config.reward_model
        scores = score_responses(self.score_fn, self._decode(batch), samples.data_sources, samples.ground_truths,
                                 samples.extra_infos)
        scores_t = torch.tensor(scores, dtype=torch.float32)
        # reward_manager dapo: the overlong penalty joins the score, so reward/* and the advantages see it (verl).
        penalties = dapo_penalties(reward_model, batch["response_mask"].sum(-1))
        return scores, (scores_t if penalties is None else scores_t + penalties)

    def _filter_groups(self, step: int, samples: StepInputs, batch: TensorBatch, scores: list[float],
                       scores_t: torch.Tensor) -> tuple[StepInputs, TensorBatch, torch.Tensor, dict[str, float]]:
        """DAPO dynamic sampling: keep the groups whose responses differ, generate more batches of prompts
        (data.gen_batch_size each, as the first) until train_batch_size groups are kept, train on exactly
        those (engine.dynamic_sampling)."""
        config, n = self.resolved.config, self.resolved.roles.rollout.n
        wanted, filter_groups = config.data.train_batch_size, config.algorithm.filter_groups

        def next_round() -> tuple[StepInputs, TensorBatch, list[float], torch.Tensor]:
            more = expand_samples(self.dataset.collate(self.order.next_indices()), n, step)
            generated = self._generate(more.prompts)
            return (more, generated, *self._score(more, generated))

        return collect_groups((samples, batch, scores, scores_t), next_round, filter_groups.metric, wanted,
                              filter_groups.max_num_gen_batches, first_group_id=step * wanted)

    def _greedy_baselines(self, samples: StepInputs, n: int) -> torch.Tensor:
        """ReMax: the reward of each prompt's greedy response, repeated for its n samples ([B])."""
        firsts = slice(None, None, n)  # samples of a prompt are adjacent: every n-th row is one prompt each
        prompts = {name: value[firsts] for name, value in samples.prompts.items()}
        rollout = self.resolved.roles.rollout
        out = generate_sharded(self.group, prompts, rollout.replicas, rollout.tensor_parallel_size, "generate_greedy")
        scores = torch.tensor(score_responses(self.score_fn, self._decode(out), samples.data_sources[firsts],
                                              samples.ground_truths[firsts], samples.extra_infos[firsts]),
                              dtype=torch.float32)
        penalties = dapo_penalties(self.resolved.config.reward_model, out["response_mask"].sum(-1))
        if penalties is not None:  # the same reward the sampled responses get
            scores = scores + penalties
        return scores.repeat_interleave(n)

    def _generate(self, prompts: TensorBatch) -> TensorBatch:
        """Rollout over every replica; the `rollout_log_probs` a backend returns stay only for the metrics."""
        rollout = self.resolved.roles.rollout
        return generate_on_replicas(self.group, "generate", prompts, rollout.replicas, rollout.tensor_parallel_size,
                                    self._balanced_order(prompts, rollout.replicas))

    def _rollout_timings(self) -> dict[str, float]:
        """The rollout backend's own seconds (wake, generate, sleep, weight load), slowest rank; its device use, max."""
        per_rank = self.group.call_all("rollout_timings")
        keys = sorted({key for timings in per_rank for key in timings})
        return {(f"memory/rollout_{k}" if k.endswith("_gb") else f"timing/rollout_{k}"):
                max(t.get(k, 0.0) for t in per_rank) for k in keys}

    def _sharded(self, method: str, batch: TensorBatch, parts: int, group: Any = None) -> TensorBatch:
        """Split `batch` over the `parts` data-parallel groups of `group` (default: the actor's), run
        `method`, concatenate (in the batch's row order, whichever rank computed a row)."""
        group = self.group if group is None else group
        order = self._balanced_order(batch, parts)
        per_rank = group.call_sharded(method, self._shards(batch, parts, group, order))
        out = concat(one_per_group(per_rank, parts))  # the sp ranks of a group return the same rows
        return out if order is None else select(out, torch.argsort(order))

    def _shards(self, batch: TensorBatch, parts: int, group: Any, order: torch.Tensor | None = None
                ) -> list[TensorBatch]:
        """A shard per rank of `group`: `parts` equal ones (balanced by tokens when trainer.balance_batch
        is on), each to the ulysses sp ranks of its data-parallel group (the same rows for all of them)."""
        order = self._balanced_order(batch, parts) if order is None else order
        return shards_for_ranks(split_even(batch if order is None else select(batch, order), parts), group.world_size)

    def _balanced_order(self, batch: TensorBatch, parts: int) -> torch.Tensor | None:
        """trainer.balance_batch: a row order giving each rank a similar token count (None: keep the order).

        The loss is normalized over the global mini batch, so which rank holds a row does not change
        the gradient; with several mini batches a step it changes which rows share an optimizer step.
        """
        if not self.resolved.config.trainer.balance_batch or parts == 1:
            return None
        return torch.tensor(balanced_order(batch["attention_mask"].sum(-1).tolist(), parts), dtype=torch.long)

    def _worker_groups(self) -> list[Any]:
        """Every worker group of the run (the actor's, then the critic's): for profiles and checkpoints."""
        return [group for group in (self.group, self.critic_group) if group is not None]

    # --- checkpoints (engine.checkpoint: layout and atomic commit; workers save their own shards) ------

    def controller_state(self) -> dict[str, Any]:
        """What the controller holds that a resume needs, as JSON (its RNG streams are saved beside it)."""
        return {
            "data_order": self.order.state_dict(),
            "history_length": len(self.history),
            "kl_coef": None if self.kl_controller is None else self.kl_controller.value,
        }

    def load_controller_state(self, state: dict[str, Any]) -> None:
        try:
            self.order.load_state_dict(state["data_order"])
        except ValueError as exc:  # another seed, batch size or dataset: a message for people, not a traceback
            raise CheckpointError(str(exc)) from None
        if self.kl_controller is not None and state.get("kl_coef") is not None:
            self.kl_controller.value = float(state["kl_coef"])

    def save_checkpoint(self, step: int) -> Path:
        if self.run_dir is None:
            raise RuntimeError("save_checkpoint() called, but the trainer has no run directory")
        started = time.perf_counter()
        trainer_cfg = self.resolved.config.trainer
        keep = {"actor": trainer_cfg.max_actor_ckpt_to_keep, "critic": trainer_cfg.max_critic_ckpt_to_keep}
        path = save_checkpoint(self.run_dir, step, self._worker_groups(), self.controller_state(), keep,
                               self.tokenizer)
        self.log(f"checkpoint: {path} ({time.perf_counter() - started:.1f}s)")
        return path

    def load_checkpoint(self, step_dir: Path) -> dict[str, Any]:
        """Continue after the checkpoint's step: workers load their shards, the controller its state.

        Returns the checkpoint's trainer_state.json.
        """
        state, notes = load_checkpoint(step_dir, self._worker_groups(), self.resolved)
        self.load_controller_state(state["controller"])
        self.start_step = int(state["step"])
        for note in notes:
            self.log(f"note: {note}")
        return state

    def export_hf(self, out_dir: Path) -> Path:
        """The actor as a HF model directory (`AutoModelForCausalLM.from_pretrained` loads it)."""
        return export_hf_model(self.group, "actor", self.tokenizer, out_dir)

    def _decode_prompts(self, prompts: TensorBatch) -> list[str]:
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(prompts["input_ids"], prompts["attention_mask"])]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def _decode(self, batch: TensorBatch) -> list[str]:
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(batch["responses"], batch["response_mask"])]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def _mean_over_ranks(self, per_rank: list[dict[str, float]]) -> dict[str, float]:
        merged = {key: sum(m[key] for m in per_rank) / len(per_rank) for key in per_rank[0]}
        for key in merged:
            values = {m[key] for m in per_rank}
            if key.startswith("memory/") or key.endswith("_max"):
                merged[key] = max(values)  # the peak is what has to fit on one device; a max is over all rows
            elif key.endswith(("/micro_batch_size", "/grad_accum_steps")) and len(values) != 1:
                # Sizes must agree on every rank; a disagreement is reported as -1, not averaged away.
                merged[key] = -1.0
        return merged


def kl_in_reward(controller: FixedKLController | AdaptiveKLController, token_scores: torch.Tensor,
                 batch: TensorBatch, kind: str) -> tuple[torch.Tensor, dict[str, float]]:
    """Token rewards minus β·KL(rollout policy || ref); β is this step's, then the controller sees the KL.

    The controller lives in the controller process: one β for the whole batch, updated once per step.
    """
    beta = controller.value
    token_rewards, mean_kl = apply_kl_in_reward(token_scores, batch["old_log_probs"], batch["ref_log_probs"],
                                                batch["response_mask"], beta, kind)
    # verl's convention: the adaptive controller's horizon counts sequences, so n_steps is the batch size.
    controller.update(float(mean_kl), n_steps=batch_size(batch))
    return token_rewards, {"kl_in_reward/kl": float(mean_kl), "kl_in_reward/beta": beta}


# Group estimators: (scores [B], group ids, response mask, algorithm config) -> advantages [B, T].
# grpo_vectorized is verl's batched grpo (it floors the group variance at 1e-6, which changes only
# groups whose std is below 1e-3); rloo_vectorized gives a singleton group 0 where rloo keeps its score.
GROUP_ADVANTAGES: dict[str, Any] = {
    "grpo": lambda s, g, m, a: compute_grpo_advantages(s, g, m, norm_by_std=a.norm_adv_by_std_in_grpo)[0],
    "grpo_vectorized": lambda s, g, m, a: compute_grpo_advantages(s, g, m, norm_by_std=a.norm_adv_by_std_in_grpo)[0],
    "rloo": lambda s, g, m, a: compute_rloo_advantages(s, g, m)[0],
    "rloo_vectorized": lambda s, g, m, a: compute_rloo_advantages(s, g, m, singleton_keeps_score=False)[0],
    "reinforce_plus_plus_baseline": lambda s, g, m, a: compute_reinforce_plus_plus_baseline_advantages(s, g, m)[0],
    "opo": lambda s, g, m, a: compute_opo_advantages(s, g, m)[0],
    "grpo_passk": lambda s, g, m, a: compute_grpo_passk_advantages(s, g, m, norm_by_std=a.norm_adv_by_std_in_grpo)[0],
    "gpg": lambda s, g, m, a: compute_gpg_advantages(s, g, m)[0],
}


# Token-baseline estimators: verl's defaults (handle_zero_tail off for OTB, on for the multi-turn variant).
TOKEN_BASELINE_ADVANTAGES: dict[str, Any] = {
    "optimal_token_baseline": compute_optimal_token_baseline_advantages,
    "tir_optimal_token_baseline": compute_tir_optimal_token_baseline_advantages,
}


def compute_advantages(algorithm: AlgorithmConfig, token_rewards: torch.Tensor, group_ids: list[int],
                       batch: TensorBatch, reward_baselines: torch.Tensor | None = None) -> TensorBatch:
    """{"advantages"} for the group estimators; also "returns" for GAE (needs batch["values"]) and REINFORCE++."""
    mask = batch["response_mask"]
    if algorithm.adv_estimator == "gae":
        advantages, returns = compute_gae(token_rewards, batch["values"], mask, algorithm.gamma, algorithm.lam)
        # Whitened over the batch (as verl): the policy step no longer scales with the reward's units.
        return {"advantages": masked_whiten(advantages, mask) * mask, "returns": returns}
    if algorithm.adv_estimator == "reinforce_plus_plus":
        # No critic and no groups: the discounted reward-to-go of each token, whitened over the batch.
        advantages, returns = compute_reinforce_plus_plus_advantages(token_rewards, mask, algorithm.gamma)
        return {"advantages": advantages, "returns": returns}
    if algorithm.adv_estimator == "remax":
        if reward_baselines is None:
            raise ValueError("adv_estimator remax needs the greedy responses' rewards (reward_baselines)")
        advantages, returns = compute_remax_advantages(token_rewards, reward_baselines, mask)
        return {"advantages": advantages, "returns": returns}
    if algorithm.adv_estimator in TOKEN_BASELINE_ADVANTAGES:
        # Per-token group baselines weighted by the old policy's path energy (its Σπ² comes from compute_log_prob).
        advantages, returns = TOKEN_BASELINE_ADVANTAGES[algorithm.adv_estimator](
            token_rewards, mask, group_ids, batch["old_log_probs"], batch["sum_pi_squared"],
            rollout_is_weights=batch.get("rollout_is_weights"))
        return {"advantages": advantages, "returns": returns}
    # Group estimators compare whole responses: a response's reward is its token rewards summed.
    scores = token_rewards.sum(-1)
    estimator = GROUP_ADVANTAGES.get(algorithm.adv_estimator)
    if estimator is None:
        raise ValueError(f"adv_estimator {algorithm.adv_estimator!r} is not run by this engine")
    return {"advantages": estimator(scores, group_ids, mask, algorithm)}


def value_metrics(batch: TensorBatch) -> dict[str, float]:
    """How well the rollout-time values predicted the returns (1 - Var[R - V] / Var[R]: 1 perfect, <= 0 useless)."""
    mask = batch["response_mask"]
    values, returns = batch["values"], batch["returns"]
    explained = 1.0 - masked_var(returns - values, mask) / masked_var(returns, mask).clamp_min(1e-8)
    return {
        "critic/values_mean": float(masked_mean(values, mask)),
        "critic/returns_mean": float(masked_mean(returns, mask)),
        "critic/advantages_mean": float(masked_mean(batch["advantages"], mask)),
        "critic/vf_explained_var": float(explained),
    }


def build_kl_controller(kl_ctrl: KLControl) -> FixedKLController | AdaptiveKLController:
    if kl_ctrl.type == "adaptive":
        return AdaptiveKLController(kl_ctrl.kl_coef, kl_ctrl.target_kl, kl_ctrl.horizon)
    return FixedKLController(kl_ctrl.kl_coef)


def total_training_steps(resolved: ResolvedPlan, batches_per_epoch: int) -> int:
    trainer = resolved.config.trainer
    return trainer.total_training_steps or trainer.total_epochs * batches_per_epoch


def describe_workers(role: str, infos: list[dict[str, Any]]) -> str:
    """One launch-log line per worker group: how many ranks, where, which backend and precision."""
    first = infos[0]
    return (f"{role}: {len(infos)} worker(s) on {first['device']} ({first['backend']}), {first['params'] / 1e6:.1f}M "
            f"parameters in {first['param_dtype'].removeprefix('torch.')}, computing in "
            f"{first['compute_dtype'].removeprefix('torch.')}")


def build_trainer(resolved: ResolvedPlan, run_dir: Path, group_factory: Callable[..., Any],
                  log: Callable[[str], None] = print) -> Trainer:
    """Prepare model files, data and workers. `group_factory(worker_cls, role, world_size, **kwargs)`."""
    plan = resolved.config
    arr = plan.actor_rollout_ref
    model_path = resolve_model_path(arr.model.path)
    tokenizer = load_tokenizer(resolve_model_path(arr.model.tokenizer_path or plan.data.tokenizer or arr.model.path),
                               arr.model.custom_chat_template, arr.model.trust_remote_code)
    files = resolve_data_files(plan.data.train_files, run_dir, "train")
    dataset = PromptDataset(read_rows(files), tokenizer, resolved.roles.rollout.prompt_length, plan.data.truncation,
                            plan.data.prompt_key, plan.data.reward_fn_key, plan.data.filter_overlong_prompts)
    # verl batches its train dataloader by the generation batch, and counts a step per batch of it.
    order = BatchOrder(len(dataset), resolved.roles.rollout.prompts_per_generation, plan.data.seed, plan.data.shuffle)
    total = total_training_steps(resolved, order.batches_per_epoch)
    log(f"data: {len(dataset)} prompts from {', '.join(str(f) for f in files)}; "
        f"{order.batches_per_epoch} steps per epoch (generation batches of {order.batch_size} prompts); "
        f"training {total} steps")
    # Loaded before any worker starts, so a missing or unreadable validation file fails fast.
    val_dataset = load_validation_dataset(resolved, run_dir, tokenizer)
    if val_dataset is not None:
        log(f"validation: {len(val_dataset)} prompts, {validation_schedule(plan.trainer, total)}")
    # The actor's pool may be smaller than the cluster when `placement` gives the critic GPUs of its own.
    group = group_factory(ActorRolloutRefWorker, ActorRolloutRefWorker.ROLE, resolved.roles.actor.world_size,
                          resolved=resolved, model_path=str(model_path), total_training_steps=total,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    log(describe_workers("actor", group.call_all("init_model")))
    stop_point("loading the actor model")
    critic_group = None
    if resolved.roles.critic is not None:
        critic_path = resolve_model_path(plan.critic.model.path or arr.model.path)
        critic_group = group_factory(CriticWorker, CriticWorker.ROLE, resolved.roles.critic.world_size,
                                     resolved=resolved, model_path=str(critic_path), total_training_steps=total)
        log(describe_workers("critic", critic_group.call_all("init_model")))
        stop_point("loading the critic model")
    kl_controller = build_kl_controller(plan.algorithm.kl_ctrl) if plan.algorithm.use_kl_in_reward else None
    return Trainer(resolved, group, tokenizer, dataset, order, total, reward_function(plan.custom_reward_function),
                   MetricsFile(run_dir / "metrics.jsonl"), log, critic_group=critic_group, kl_controller=kl_controller,
                   sinks=open_sinks(resolved, run_dir), val_dataset=val_dataset, profile_dir=run_dir / "profile")

