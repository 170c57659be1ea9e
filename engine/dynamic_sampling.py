"""DAPO dynamic sampling (verl's algorithm.filter_groups): keep only prompt groups whose responses disagree.

A group whose n responses all have the same value of the filter metric (all right or all wrong) gets
zero advantage under any group baseline and only dilutes the batch. The trainer generates batches
of prompts, keeps the informative groups, and generates again until it holds at least
train_batch_size groups, then trims to exactly that many (docs/algo/dapo.md of verl). Pure functions:
the trainer does the generating.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class GroupSelection:
    """Rows of the informative groups of one generation batch, in batch order, and the group counts."""

    rows: list[int]
    kept_groups: int
    total_groups: int


def select_informative_groups(group_ids: Sequence[Hashable], values: Sequence[float]) -> GroupSelection:
    """Keep the rows of every group whose ``values`` (the filter metric per response) are not all equal."""
    if len(group_ids) != len(values):
        raise ValueError(f"{len(group_ids)} group ids for {len(values)} metric values")
    values_of: dict[Hashable, list[float]] = {}
    for group, value in zip(group_ids, values, strict=True):
        values_of.setdefault(group, []).append(float(value))
    informative = {group for group, vals in values_of.items() if max(vals) != min(vals)}
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
