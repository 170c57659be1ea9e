"""The single controller: one GRPO training step after another, reading top to bottom.

The controller holds the data and the rewards; workers hold the models. Each step:
prompts -> n samples each -> generate -> decode + reward -> old log-probs -> (ref log-probs)
-> group advantages -> actor update -> push weights to the rollout copy -> metrics.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from engine.algos.advantages import compute_grpo_advantages, compute_rloo_advantages
from engine.data.dataset import BatchOrder, PromptBatch, PromptDataset, read_rows
from engine.data.sources import resolve_data_files
from engine.metrics import MetricsFile, StageTimer, console_line, first_non_finite
from engine.models.loading import load_tokenizer, resolve_model_path
from engine.rewards.batch import reward_function, score_responses
from engine.workers.actor_rollout_ref import ActorRolloutRefWorker
from engine.workers.batch import TensorBatch, concat, split_even
from rlconf.resolved import ResolvedPlan


class NonFiniteError(RuntimeError):
    """A loss or gradient norm became NaN/inf; the run stops rather than train on garbage."""


ADVANTAGE_ESTIMATORS = {"grpo", "rloo"}


def unsupported_features(resolved: ResolvedPlan) -> list[str]:
    """What this engine slice cannot run yet, as messages for people (empty: runnable)."""
    plan = resolved.config
    arr = plan.actor_rollout_ref
    problems = []
    if plan.algorithm.adv_estimator not in ADVANTAGE_ESTIMATORS:
        problems.append(f"algorithm.adv_estimator={plan.algorithm.adv_estimator}: the engine runs "
                        f"{' and '.join(sorted(ADVANTAGE_ESTIMATORS))} so far (no critic yet)")
    if len(set(resolved.placement.roles.values())) > 1:
        problems.append("placement: roles on separate pools are not implemented yet; omit `placement` to colocate")
    if arr.rollout.name != "hf" and plan.trainer.device == "cpu":
        problems.append(f"rollout.name={arr.rollout.name} needs a GPU; use rollout.name=hf on CPU")
    if arr.rollout.name == "vllm":
        problems.append("rollout.name=vllm is not implemented yet; use rollout.name=hf")
    if resolved.roles.rollout.tensor_parallel_size != 1:
        problems.append("rollout.tensor_model_parallel_size > 1 is not implemented for HF generate")
    if resolved.roles.actor.sp_size != 1:
        problems.append("ulysses_sequence_parallel_size > 1 is not implemented yet")
    if resolved.roles.actor.use_dynamic_bsz:
        problems.append("use_dynamic_bsz is not implemented yet; set ppo_micro_batch_size_per_gpu")
    if plan.algorithm.use_kl_in_reward:
        problems.append("algorithm.use_kl_in_reward is not implemented yet; use actor.use_kl_loss")
    if plan.reward_model.enable:
        problems.append("reward_model.enable: model-based rewards are not implemented yet")
    if plan.trainer.device == "cuda" and not torch.cuda.is_available():
        problems.append("trainer.device=cuda but no CUDA device is visible; use trainer.device=cpu")
    if plan.trainer.device == "cuda":
        problems.append("trainer.device=cuda: the first engine slice runs on CPU (gloo) only")
    return problems


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

    def train(self, on_step: Callable[[int], None] = lambda step: None) -> None:
        for step in range(1, self.total_steps + 1):
            metrics = self.step(step)
            self.metrics_file.write(metrics)
            self.history.append(metrics)
            self.log(console_line(step, self.total_steps, metrics))
            bad = first_non_finite(metrics, ("actor/pg_loss", "actor/loss", "actor/grad_norm"))
            if bad is not None:
                raise NonFiniteError(f"step {step}: actor {bad} is {metrics[bad]} (non-finite); stopping the run")
            on_step(step)

    def step(self, step: int) -> dict[str, Any]:
        roles, config = self.resolved.roles, self.resolved.config
        timer = StageTimer()
        step_start = time.perf_counter()

        with timer.stage("data"):
            samples = expand_samples(self.dataset.collate(self.order.next_indices()), roles.rollout.n, step)

        with timer.stage("generate"):
            batch = self._sharded("generate", samples.prompts, roles.rollout.replicas)

        with timer.stage("reward"):
            texts = self._decode(batch)
            scores = score_responses(self.score_fn, texts, samples.data_sources, samples.ground_truths,
                                     samples.extra_infos)
            scores_t = torch.tensor(scores, dtype=torch.float32)

        with timer.stage("old_log_prob"):
            batch.update(self._sharded("compute_log_prob", batch, roles.rollout.log_prob.dp_size))

        if roles.ref is not None:
            with timer.stage("ref"):
                batch.update(self._sharded("compute_ref_log_prob", batch, roles.ref.dp_size))

        with timer.stage("adv"):
            if config.algorithm.adv_estimator == "grpo":
                advantages, _ = compute_grpo_advantages(scores_t, samples.group_ids, batch["response_mask"],
                                                        norm_by_std=config.algorithm.norm_adv_by_std_in_grpo)
            else:
                advantages, _ = compute_rloo_advantages(scores_t, samples.group_ids, batch["response_mask"])
            batch["advantages"] = advantages

        with timer.stage("update_actor"):
            shards = split_even(batch, roles.actor.dp_size)
            actor_metrics = self._mean_over_ranks(self.group.call_sharded("update_actor", shards))

        with timer.stage("weight_sync"):
            # Worker-side seconds exclude the Ray round trip that timing/weight_sync includes.
            gather_seconds = max(self.group.call_all("sync_rollout_weights"))

        step_seconds = time.perf_counter() - step_start
        response_lengths = batch["response_mask"].sum(-1).float()
        tokens = int(batch["attention_mask"].sum())
        return {
            "step": step,
            "epoch": self.order.epoch,
            "reward/mean": float(scores_t.mean()),
            "reward/max": float(scores_t.max()),
            "reward/full_credit_fraction": float((scores_t >= 1.0).float().mean()),
            "response_length/mean": float(response_lengths.mean()),
            "response_length/clip_fraction": float((response_lengths >= roles.rollout.response_length).float().mean()),
            "perf/tokens": tokens,
            "perf/tokens_per_second": tokens / step_seconds,
            **actor_metrics,
            **timer.as_metrics(),
            "timing/weight_gather_in_worker": gather_seconds,
            "timing/step": step_seconds,
        }

    def _sharded(self, method: str, batch: TensorBatch, parts: int) -> TensorBatch:
        return concat(self.group.call_sharded(method, split_even(batch, parts)))

    def _decode(self, batch: TensorBatch) -> list[str]:
        rows = [ids[mask.bool()].tolist() for ids, mask in zip(batch["responses"], batch["response_mask"])]
        return self.tokenizer.batch_decode(rows, skip_special_tokens=True)

    def _mean_over_ranks(self, per_rank: list[dict[str, float]]) -> dict[str, float]:
        merged = {key: sum(m[key] for m in per_rank) / len(per_rank) for key in per_rank[0]}
        # Sizes must agree on every rank; a disagreement is reported as -1, not averaged away.
        for key in ("actor/micro_batch_size", "actor/grad_accum_steps"):
            if len({m[key] for m in per_rank}) != 1:
                merged[key] = -1.0
        return merged


def total_training_steps(resolved: ResolvedPlan, batches_per_epoch: int) -> int:
    trainer = resolved.config.trainer
    return trainer.total_training_steps or trainer.total_epochs * batches_per_epoch


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
    order = BatchOrder(len(dataset), plan.data.train_batch_size, plan.data.seed, plan.data.shuffle)
    total = total_training_steps(resolved, order.batches_per_epoch)
    log(f"data: {len(dataset)} prompts from {', '.join(str(f) for f in files)}; "
        f"{order.batches_per_epoch} steps per epoch; training {total} steps")
    group = group_factory(ActorRolloutRefWorker, ActorRolloutRefWorker.ROLE, resolved.world.world_size,
                          resolved=resolved, model_path=str(model_path), total_training_steps=total,
                          pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    group.call_all("init_model")
    return Trainer(resolved, group, tokenizer, dataset, order, total, reward_function(plan.custom_reward_function),
                   MetricsFile(run_dir / "metrics.jsonl"), log)

