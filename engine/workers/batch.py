"""Batches between the controller and the workers are plain dicts of tensors sharing dim 0.

Helpers to split them by rank, into mini and micro batches, and to put them back together.
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
