"""How the controller hands a batch to a worker group: one shard per rank, results back in row order."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from engine.batch import TensorBatch, balanced_order, batch_size, concat, select, split_even
from engine.workers.sequence.ulysses import one_per_group, shards_for_ranks


@dataclass(frozen=True)
class Dispatch:
    balance_batch: bool  # trainer.balance_batch

    def sharded(self, group: Any, method: str, batch: TensorBatch, parts: int) -> TensorBatch:
        """Split `batch` over the `parts` data-parallel groups of `group`, run `method`, concatenate
        (in the batch's row order, whichever rank computed a row)."""
        order = self.balanced_order(batch, parts)
        per_rank = group.call_sharded(method, self.shards(batch, parts, group, order))
        out = concat(one_per_group(per_rank, parts))  # the sp ranks of a group return the same rows
        return out if order is None else select(out, torch.argsort(order))

    def sharded_any_rows(self, group: Any, method: str, batch: TensorBatch, parts: int) -> TensorBatch:
        """As `sharded`, for a batch of any size (validation, ReMax's greedy rows): the last row is
        repeated until the rows split evenly, and its copies are dropped from the result."""
        rows = batch_size(batch)
        fill = -rows % parts
        if fill:
            batch = select(batch, torch.cat([torch.arange(rows), torch.full((fill,), rows - 1, dtype=torch.long)]))
        out = self.sharded(group, method, batch, parts)
        return select(out, slice(0, rows)) if fill else out

    def shards(self, batch: TensorBatch, parts: int, group: Any, order: torch.Tensor | None = None
               ) -> list[TensorBatch]:
        """A shard per rank of `group`: `parts` equal ones (balanced by tokens when trainer.balance_batch
        is on), each to the ulysses sp ranks of its data-parallel group (the same rows for all of them)."""
        order = self.balanced_order(batch, parts) if order is None else order
        return shards_for_ranks(split_even(batch if order is None else select(batch, order), parts), group.world_size)

    def balanced_order(self, batch: TensorBatch, parts: int) -> torch.Tensor | None:
        """trainer.balance_batch: a row order giving each rank a similar token count (None: keep the order).

        The loss is normalized over the global mini batch, so which rank holds a row does not change
        the gradient; with several mini batches a step it changes which rows share an optimizer step.
        """
        if not self.balance_batch or parts == 1:
            return None
        return torch.tensor(balanced_order(batch["attention_mask"].sum(-1).tolist(), parts), dtype=torch.long)


def mean_over_ranks(per_rank: list[dict[str, float]]) -> dict[str, float]:
    merged = {key: sum(m[key] for m in per_rank) / len(per_rank) for key in per_rank[0]}
    for key in merged:
        values = {m[key] for m in per_rank}
        if key.startswith("memory/") or key.endswith("_max"):
            merged[key] = max(values)  # the peak is what has to fit on one device; a max is over all rows
        elif key.endswith(("/micro_batch_size", "/grad_accum_steps")) and len(values) != 1:
            # Sizes must agree on every rank; a disagreement is reported as -1, not averaged away.
            merged[key] = -1.0
    return merged
