"""The actor's full weights for the rollout, gathered from its FSDP2 shards in buckets.

The rollout needs every tensor whole after each update. DTensor's own `full_tensor()` does that
one tensor at a time, but each call goes through DTensor's dispatch (a cast and a redistribute,
about 0.2 ms of CPU each) and, over several ranks, one collective per tensor: hundreds of small
all-gathers for a 1.5B model. Here the local shards are cast to the rollout's dtype, packed into
buckets of about `bucket_bytes`, and each bucket is one all-gather into one tensor (`all_gather_single`) over the ranks
that split the rows; on a mesh of one rank the local shard already is the full tensor and nothing
is gathered at all. Peak memory stays at one bucket's full tensors (and its send buffer), never a
full copy of the model.

FSDP2 splits dim 0 the way `torch.chunk` does: each rank of the group holds up to
ceil(rows / ranks) rows, in rank order, the last ones fewer or none. Each rank pads its rows to
that size in the send buffer, so the gathered buffer is [ranks, bucket] and tensor i's full rows
are the ranks' slices at its offset, stacked, then trimmed to its row count.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from typing import NamedTuple

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor, Replicate, Shard

# Large enough that a 1.5B model takes about a dozen all-gathers, small next to vLLM's KV cache.
BUCKET_BYTES = 256 * 1024**2
# torch 2.13 renamed the collective and warns on the old name at every call; older torch has only that one.
ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class RowGroup(NamedTuple):
    """The ranks over which a tensor's rows are split (one dimension of its device mesh)."""

    group: dist.ProcessGroup
    size: int


class _Slot(NamedTuple):
    name: str
    shape: torch.Size
    rows_per_rank: int  # ceil(rows / ranks): the padded shard every rank sends
    offset: int  # into each rank's part of the bucket, in elements


@torch.no_grad()  # also makes to_local() cheap: with grad mode on it is an autograd op (~40x the CPU time)
def full_tensors(sharded: nn.Module, dtype: torch.dtype | None = None,
                 bucket_bytes: int = BUCKET_BYTES) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for each of `sharded`'s tensors, in state-dict order (a collective:
    every rank iterates to the end in the same order).

    Floating tensors are cast to `dtype` (None: as stored) before they are gathered, so a bf16
    rollout receives half the bytes of fp32 master weights. A shard that waits on the CPU
    (param_offload, offload_policy) travels to its mesh's device first, so the full tensors arrive
    where the rollout runs. A tensor tied to an earlier one (a shared embedding and LM head) is
    sent once, under the first name: the backends load tied weights from either name.
    """
    bucket: list[tuple[_Slot, torch.Tensor]] = []
    bucket_key: tuple | None = None
    used = 0  # elements of each rank's part of the bucket
    for name, value in _untied_state(sharded):
        group = row_group(value)
        if group is None:
            yield from _flush(bucket, bucket_key)
            bucket, used = [], 0
            yield name, _whole(value, dtype)
            continue
        local = _local_on_mesh_device(value)
        if dtype is not None and local.is_floating_point():
            local = local.to(dtype)
        key = (group.group, group.size, local.dtype, local.device)
        rows_per_rank = math.ceil(value.shape[0] / group.size)
        numel = rows_per_rank * math.prod(value.shape[1:])
        if bucket and (key != bucket_key or (used + numel) * group.size * local.element_size() > bucket_bytes):
            yield from _flush(bucket, bucket_key)
            bucket, used = [], 0
        bucket_key = key
        bucket.append((_Slot(name, value.shape, rows_per_rank, used), local))
        used += numel
    yield from _flush(bucket, bucket_key)


def row_group(value: torch.Tensor) -> RowGroup | None:
    """The mesh dimension that splits `value`'s rows when gathering is needed; None when this rank
    holds it whole (a plain tensor, or a mesh of one rank) or when it is laid out otherwise than
    FSDP2's row split with replicas (then `_whole` lets DTensor gather it)."""
    if not isinstance(value, DTensor) or value.device_mesh.size() == 1:
        return None
    sharded_dims = [dim for dim, placement in enumerate(value.placements) if placement != Replicate()]
    if len(sharded_dims) != 1 or value.placements[sharded_dims[0]] != Shard(0) or value.dim() == 0:
        return None
    dim = sharded_dims[0]
    return RowGroup(value.device_mesh.get_group(dim), value.device_mesh.size(dim))


def _untied_state(sharded: nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    seen: set[int] = set()
    for name, value in sharded.state_dict().items():
        local = value.to_local() if isinstance(value, DTensor) else value
        if local.data_ptr() in seen and local.numel():
            continue  # tied weights (lm_head = embed_tokens): one gather serves both names
        seen.add(local.data_ptr())
        yield name, value


def _whole(value: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """A tensor this rank can produce without bucketing: plain, whole on a one-rank mesh, or gathered
    by DTensor itself (layouts other than FSDP2's)."""
    if isinstance(value, DTensor):
        if value.device_mesh.size() == 1:
            value = _local_on_mesh_device(value)
        else:
            value = DTensor.from_local(_local_on_mesh_device(value), value.device_mesh, value.placements,
                                       shape=value.shape, stride=value.stride())
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
            return value.full_tensor()
    return value.to(dtype) if dtype is not None and value.is_floating_point() else value


def _local_on_mesh_device(value: DTensor) -> torch.Tensor:
    local = value.to_local()
    device_type = value.device_mesh.device_type
    return local if local.device.type == device_type else local.to(device_type)


def _flush(bucket: list[tuple[_Slot, torch.Tensor]], key: tuple | None) -> Iterator[tuple[str, torch.Tensor]]:
    if not bucket:
        return
    group, size, dtype, device = key
    per_rank = sum(slot.rows_per_rank * math.prod(slot.shape[1:]) for slot, _ in bucket)
    send = torch.zeros(per_rank, dtype=dtype, device=device)  # zeros: the padding rows are sent too
    for slot, local in bucket:
        send[slot.offset: slot.offset + local.numel()].copy_(local.reshape(-1))
    received = torch.empty(size * per_rank, dtype=dtype, device=device)
    ALL_GATHER_SINGLE(received, send, group=group)
    del send
    by_rank = received.view(size, per_rank)
    for slot, _ in bucket:
        numel = slot.rows_per_rank * math.prod(slot.shape[1:])
        rows = by_rank[:, slot.offset: slot.offset + numel].reshape(size * slot.rows_per_rank, *slot.shape[1:])
        yield slot.name, rows[: slot.shape[0]]


class TimedTensors:
    """Wraps (name, tensor) pairs and adds up the seconds spent producing them (the gather's share of a
    weight sync, the consumer's excluded; on CUDA the CPU's side of it: kernels run asynchronously)."""

    def __init__(self, tensors: Iterator[tuple[str, torch.Tensor]]) -> None:
        self._tensors, self.seconds = tensors, 0.0

    def __iter__(self) -> TimedTensors:
        return self

    def __next__(self) -> tuple[str, torch.Tensor]:
        started = time.perf_counter()
        try:
            return next(self._tensors)
        finally:
            self.seconds += time.perf_counter() - started
