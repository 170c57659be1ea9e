"""Validation: the current policy answers the prompts of `data.val_files`, scored by the training reward.

When: every `trainer.test_freq` steps and after the last step (as verl), and once before the first
step with `trainer.val_before_train`. How: the same sharded worker generation the training step
uses, but sampling with `rollout.val_kwargs` (greedy by default, `n` samples per prompt), on the
rollout copy, which holds the weights of the latest update. No gradient, no optimizer state touched.

Metrics: `val/reward/mean` over every sample, `val/<data_source>/reward/mean` per data source,
`val/response_length/mean`, and `timing/validation`. With `trainer.log_val_generations` N > 0, N
samples (prompt, response, score) are kept per validation (:func:`pick_generations`).
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from engine.controller.samples import StepInputs, expand_samples
from engine.data.dataset import PromptDataset, read_rows
from engine.data.sources import resolve_data_files
from engine.rollout.replicas import generate_on_replicas
from engine.batch import TensorBatch, select
from rlconf.resolved import ResolvedPlan


def validation_requested(resolved: ResolvedPlan) -> bool:
    trainer = resolved.config.trainer
    return trainer.test_freq > 0 or trainer.val_before_train


def should_validate(step: int, total_steps: int, test_freq: int) -> bool:
    """After every test_freq-th step and after the last one (the final policy is always measured)."""
    return test_freq > 0 and (step % test_freq == 0 or step == total_steps)


def validation_schedule(trainer: Any, total_steps: int) -> str:
    """When validation runs, in words, for the launch log."""
    when = []
    if trainer.val_before_train:
        when.append("before step 1")
    if trainer.test_freq > 0:
        when.append(f"after every {trainer.test_freq} steps and after step {total_steps}")
    return " and ".join(when)


def load_validation_dataset(resolved: ResolvedPlan, run_dir: Path, tokenizer: Any) -> PromptDataset | None:
    """The validation prompts, tokenized like the training ones; None when the plan never validates."""
    data = resolved.config.data
    if not validation_requested(resolved) or not data.val_files:
        return None
    files = resolve_data_files(data.val_files, run_dir, "val")
    return PromptDataset(read_rows(files), tokenizer, resolved.roles.rollout.prompt_length, data.truncation,
                         data.prompt_key, data.reward_fn_key, data.filter_overlong_prompts)


def generate_sharded(group: Any, prompts: TensorBatch, replicas: int, tensor_parallel_size: int = 1,
                     method: str = "generate_for_validation") -> TensorBatch:
    """Validation (or ReMax's greedy) generation over every rollout replica; rows are padded to a multiple of `replicas`.

    A validation set need not divide by the world size (training batches do, by the compiler's
    rules), so the last row is repeated to fill the last shard and its copies are dropped afterwards.
    """
    rows = prompts["input_ids"].shape[0]
    padded_rows = -(-rows // replicas) * replicas
    if padded_rows != rows:
        fill = torch.full((padded_rows - rows,), rows - 1, dtype=torch.long)
        prompts = select(prompts, torch.cat([torch.arange(rows), fill]))
    out = generate_on_replicas(group, method, prompts, replicas, tensor_parallel_size)
    return select(out, slice(0, rows))


def run_validation(group: Any, dataset: PromptDataset, decode: Callable[[TensorBatch], list[str]],
                   score: Callable[[StepInputs, TensorBatch], list[float]], resolved: ResolvedPlan,
                   samples: list[tuple[str, str, float]] | None = None,
                   decode_prompts: Callable[[TensorBatch], list[str]] | None = None) -> dict[str, float]:
    """Generate for every validation prompt (val_kwargs.n samples each), score, and summarize.

    `score`: the training step's reward (engine.controller.stages.StepStages.score: the rule scorer
    with dapo's overlong penalty, or the reward model), as verl validates with its reward manager.
    `samples`, when given with `decode_prompts`, receives (prompt, response, score) for every sample.
    """
    started = time.perf_counter()
    rollout_role = resolved.roles.rollout
    n = resolved.config.actor_rollout_ref.rollout.val_kwargs.n
    # As many sequences per generate call as a training step generates: the memory the plan was checked for.
    prompts_per_call = max(1, rollout_role.sequences_per_step // n)
    scores: list[float] = []
    sources: list[str] = []
    response_lengths: list[float] = []
    for start in range(0, len(dataset), prompts_per_call):
        batch = dataset.collate(range(start, min(start + prompts_per_call, len(dataset))))
        inputs = expand_samples(batch, n, step=0)
        out = generate_sharded(group, inputs.prompts, rollout_role.replicas, rollout_role.tensor_parallel_size)
        new_scores = score(inputs, out)
        if samples is not None and decode_prompts is not None:
            samples += zip(decode_prompts(inputs.prompts), decode(out), new_scores, strict=True)
        scores += new_scores
        sources += inputs.data_sources
        response_lengths += out["response_mask"].sum(-1).float().tolist()
    return summarize(scores, sources, response_lengths) | {"timing/validation": time.perf_counter() - started}


def _repeat(values: list[Any], n: int) -> list[Any]:
    """Per-prompt values -> per-sample values (samples of a prompt are adjacent, as repeat_interleave)."""
    return [v for v in values for _ in range(n)]


def summarize(scores: list[float], sources: list[str], response_lengths: list[float]) -> dict[str, float]:
    by_source: dict[str, list[float]] = defaultdict(list)
    for score, source in zip(scores, sources, strict=True):
        by_source[source].append(score)
    metrics = {"val/reward/mean": sum(scores) / len(scores),
               "val/response_length/mean": sum(response_lengths) / len(response_lengths)}
    for source, values in sorted(by_source.items()):
        metrics[f"val/{source}/reward/mean"] = sum(values) / len(values)
    return metrics


def pick_generations(samples: list[tuple[str, str, float]], count: int) -> list[tuple[str, str, float]]:
    """`count` of the validation samples, the same prompts every validation (verl's choice).

    As verl: sorted by prompt text, shuffled by numpy's RandomState(42), the first `count` taken.
    """
    if count <= 0:
        return []
    import numpy as np

    ordered = sorted(samples, key=lambda sample: sample[0])
    np.random.RandomState(42).shuffle(ordered)
    return ordered[:count]
