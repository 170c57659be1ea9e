"""The batch every stage passes along: a plain dict of tensors sharing dim 0.

The controller, the rollout backends and the FSDP workers all speak it, so it sits below all of
them (as verl's `protocol.py` does) and imports nothing of the engine. Helpers split it by rank,
into mini and micro batches, put it back together, and derive what every stage reads from a mask.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch

TensorBatch = dict[str, torch.Tensor]


def batch_size(batch: TensorBatch) -> int:
    sizes = {name: t.shape[0] for name, t in batch.items()}
    if len(set(sizes.values())) != 1:
        raise ValueError(f"batch fields disagree on the number of rows: {sizes}")
    return next(iter(sizes.values()))


def masked_rows(ids: torch.Tensor, mask: torch.Tensor) -> list[list[int]]:
    """Each row's ids where its mask is set, as lists: the kept ids and each row's count in two .tolist() calls,
    then slices. Iterating the tensors row by row (a tensor and a boolean index per row) was most of the driver's
    CPU time in a CPU launch's step. A mask of another shape than the ids raises, as the boolean index does."""
    keep = mask.bool()
    flat, counts = ids[keep].tolist(), keep.sum(dim=1).tolist()
    rows, start = [], 0
    for count in counts:
        rows.append(flat[start:start + count])
        start += count
    return rows


def select(batch: TensorBatch, rows: slice | torch.Tensor) -> TensorBatch:
    return {name: t[rows] for name, t in batch.items()}


def chunk(batch: TensorBatch, size: int) -> Iterator[TensorBatch]:
    """Consecutive slices of `size` rows (the last one shorter if size does not divide)."""
    total = batch_size(batch)
    for start in range(0, total, size):
        yield select(batch, slice(start, start + size))


def split_even(batch: TensorBatch, parts: int) -> list[TensorBatch]:
    """`parts` equal slices; the compiler guarantees divisibility, so a remainder is a bug."""
    total = batch_size(batch)
    if total % parts:
        raise ValueError(f"{total} rows do not split evenly over {parts} ranks")
    return list(chunk(batch, total // parts))


def concat(batches: list[TensorBatch]) -> TensorBatch:
    return {name: torch.cat([b[name] for b in batches]) for name in batches[0]}


def balanced_order(lengths: list[int], parts: int) -> list[int]:
    """A row order whose `parts` equal consecutive slices have similar total lengths (trainer.balance_batch).

    Longest rows first, dealt to the slices back and forth (0..k-1, k-1..0, ...), so every slice gets
    the same number of rows and a similar number of tokens: no rank waits on a rank with the long ones.
    """
    if len(lengths) % parts:
        raise ValueError(f"{len(lengths)} rows do not split evenly over {parts} ranks")
    slices: list[list[int]] = [[] for _ in range(parts)]
    by_length = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    for position, row in enumerate(by_length):
        lap, offset = divmod(position, parts)
        slices[offset if lap % 2 == 0 else parts - 1 - offset].append(row)
    return [row for part in slices for row in sorted(part)]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    # Left padding: real tokens must start at position 0, as they did during generation.
    return (attention_mask.cumsum(-1) - 1).clamp_min(0)
