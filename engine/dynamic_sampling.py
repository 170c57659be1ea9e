"""DAPO dynamic sampling (verl's algorithm.filter_groups): keep only prompt groups whose responses disagree.

A group whose n responses all have the same value of the filter metric (all right or all wrong) gets
zero advantage under any group baseline and only dilutes the batch. The trainer generates batches
of prompts, keeps the informative groups, and generates again until it holds at least
train_batch_size groups, then trims to exactly that many (docs/algo/dapo.md of verl). Each generation
batch holds data.gen_batch_size prompts (verl's DAPO scripts use 3 × train_batch_size). Pure functions:
the trainer does the generating (the `next_round` callback of collect_groups); the rest only picks and
stacks rows.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from engine.batch import TensorBatch, concat, select


@dataclass(frozen=True)
class GroupSelection:
    """Rows of the informative groups of one generation batch, in batch order, and the group counts."""

    rows: list[int]
    kept_groups: int
    total_groups: int


def select_informative_groups(group_ids: Sequence[Hashable], values: Sequence[float]) -> GroupSelection:
    """Keep the rows of every group whose ``values`` (the filter metric per response) are not all equal, and every
    group of one response, which verl keeps too (v1/replay_buffer.py filters only groups of 2 or more)."""
    if len(group_ids) != len(values):
        raise ValueError(f"{len(group_ids)} group ids for {len(values)} metric values")
    values_of: dict[Hashable, list[float]] = {}
    for group, value in zip(group_ids, values, strict=True):
        values_of.setdefault(group, []).append(float(value))
    informative = {group for group, vals in values_of.items() if len(vals) == 1 or max(vals) != min(vals)}
    rows = [row for row, group in enumerate(group_ids) if group in informative]
    return GroupSelection(rows, len(informative), len(values_of))


def needs_another_batch(kept_groups: int, train_batch_size: int, gen_batches: int, max_num_gen_batches: int) -> bool:
    """Whether to generate one more batch after ``gen_batches`` batches have kept ``kept_groups`` groups.

    Raises:
        RuntimeError: too few groups after ``max_num_gen_batches`` batches (> 0); verl stops there too,
            since training on a short batch would change the batch size the plan was checked for.
    """
    if kept_groups >= train_batch_size:
        return False
    if max_num_gen_batches <= 0 or gen_batches < max_num_gen_batches:
        return True
    raise RuntimeError(
        f"dynamic sampling kept {kept_groups} prompt groups after {gen_batches} generation batches "
        f"(algorithm.filter_groups.max_num_gen_batches={max_num_gen_batches}), fewer than "
        f"data.train_batch_size={train_batch_size}: almost every group's responses score the same. "
        "Raise max_num_gen_batches (0 = no limit), or use prompts the policy sometimes solves")


def trim_to_groups(group_ids: Sequence[Hashable], train_batch_size: int) -> list[int]:
    """Rows of the first ``train_batch_size`` groups (in order of first appearance) of the kept rows."""
    first: dict[Hashable, None] = {}
    rows = []
    for row, group in enumerate(group_ids):
        if group not in first:
            if len(first) == train_batch_size:
                continue
            first[group] = None
        rows.append(row)
    return rows


def metric_values(metric: str, scores: Sequence[float], scores_with_penalty: torch.Tensor) -> list[float]:
    """The filter metric per response: ``score`` is the scorer's own; ``reward`` (verl 0.9.1's canonical
    pre-KL reward, its rm_scores), ``seq_reward`` and ``seq_final_reward`` the score the advantages see (with
    the dapo overlong penalty; the compiler refuses seq_final_reward with KL in the reward, which would differ)."""
    if metric == "score":
        return [float(value) for value in scores]
    if metric in ("reward", "seq_reward", "seq_final_reward"):
        return scores_with_penalty.tolist()
    raise ValueError(f"algorithm.filter_groups.metric {metric!r} is not computed by this engine "
                     "(score, reward, seq_reward or seq_final_reward)")


def take_rows(samples: Any, batch: TensorBatch, scores: torch.Tensor, rows: list[int], gen_batch: int
              ) -> tuple[Any, TensorBatch, torch.Tensor]:
    """The chosen rows of one generation batch (a StepInputs, its generated rows, their scores); group ids
    become (gen_batch, id) so that groups of different generation batches never share an id."""
    index = torch.tensor(rows, dtype=torch.long)
    picked = replace(samples, prompts=select(samples.prompts, index),
                     group_ids=[(gen_batch, samples.group_ids[row]) for row in rows],
                     data_sources=[samples.data_sources[row] for row in rows],
                     ground_truths=[samples.ground_truths[row] for row in rows],
                     extra_infos=[samples.extra_infos[row] for row in rows],
                     raw_prompts=[samples.raw_prompts[row] for row in rows] if samples.raw_prompts else [])
    return picked, select(batch, index), scores[index]


def join_parts(parts: list[tuple[Any, TensorBatch, torch.Tensor]], train_batch_size: int, first_group_id: int
               ) -> tuple[Any, TensorBatch, torch.Tensor]:
    """Stack the kept rows of every generation batch, keep the first ``train_batch_size`` groups, and number
    them ``first_group_id, first_group_id + 1, ...`` as a step without filtering would."""
    group_ids = [group for samples, _, _ in parts for group in samples.group_ids]
    rows = torch.tensor(trim_to_groups(group_ids, train_batch_size), dtype=torch.long)
    number: dict[Hashable, int] = {}
    kept_ids = [number.setdefault(group_ids[row], first_group_id + len(number)) for row in rows.tolist()]
    first = parts[0][0]

    def stacked(field: str) -> list[Any]:
        values = [value for samples, _, _ in parts for value in getattr(samples, field)]
        return [values[row] for row in rows.tolist()]

    samples = replace(first, prompts=select(concat([p[0].prompts for p in parts]), rows), group_ids=kept_ids,
                      data_sources=stacked("data_sources"), ground_truths=stacked("ground_truths"),
                      extra_infos=stacked("extra_infos"),
                      raw_prompts=stacked("raw_prompts") if first.raw_prompts else [])
    return samples, select(concat([p[1] for p in parts]), rows), torch.cat([p[2] for p in parts])[rows]


# One generation round: (its StepInputs, its generated rows, the scorer's scores, the scores the advantages see).
Round = tuple[Any, TensorBatch, list[float], torch.Tensor]


def collect_groups(first: Round, next_round: Callable[[], Round], metric: str, train_batch_size: int,
                   max_num_gen_batches: int, first_group_id: int
                   ) -> tuple[Any, TensorBatch, torch.Tensor, dict[str, float]]:
    """Keep the informative groups of ``first`` and of as many more rounds (``next_round()``) as it takes to
    hold ``train_batch_size`` groups; return exactly that many (join_parts) and the round counts."""
    parts, kept_groups, total_groups, gen_batches = [], 0, 0, 0
    current = first
    while True:
        gen_batches += 1
        samples, batch, scores, scores_t = current
        selection = select_informative_groups(samples.group_ids, metric_values(metric, scores, scores_t))
        parts.append(take_rows(samples, batch, scores_t, selection.rows, gen_batches))
        kept_groups, total_groups = kept_groups + selection.kept_groups, total_groups + selection.total_groups
        if not needs_another_batch(kept_groups, train_batch_size, gen_batches, max_num_gen_batches):
            break
        current = next_round()
    samples, batch, scores_t = join_parts(parts, train_batch_size, first_group_id)
    return samples, batch, scores_t, {"dynamic_sampling/gen_batches": gen_batches,
                                      "dynamic_sampling/kept_groups": kept_groups,
                                      "dynamic_sampling/total_groups": total_groups}
