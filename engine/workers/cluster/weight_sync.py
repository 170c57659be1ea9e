"""The trainer's weights to a rollout pool of its own: one collective group spanning both pools, bucketed.

With hybrid_engine off (one-step off-policy) the rollout workers are other processes, on other GPUs,
than the actor's. After an update the actor's ranks gather their FSDP shards into full tensors
(engine.workers.fsdp.gather, a collective of the actor's own group) and actor rank 0 broadcasts
them to every rollout rank over a second group: actor rank 0 is its rank 0, rollout rank r its rank
r + 1. The tensors travel packed into flat buckets of at most `checkpoint_engine.update_weights_bucket_megabytes`,
one broadcast each, never through a file. The group is NCCL between GPUs and gloo between CPU
processes, built the same way (`open_weight_group`), so the CPU tests run the GPU path's code.

Both sides know the layout beforehand (`plan_buckets` over the names, shapes and dtypes the actor
reports once at start-up), so a bucket carries only the numbers.
"""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Iterator
from typing import NamedTuple

import torch
import torch.distributed as dist

SYNC_TIMEOUT_S = 600  # a push waits for the rollout to finish its generation at most this long
DTYPES = {str(dtype): dtype for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64, torch.int32,
                                          torch.bool, torch.uint8)}


class TensorInfo(NamedTuple):
    name: str
    shape: tuple[int, ...]
    dtype: str  # str(torch.dtype): travels through Ray and JSON as it is


class Slot(NamedTuple):
    name: str
    shape: tuple[int, ...]
    offset: int  # into the bucket, in elements
    numel: int


class Bucket(NamedTuple):
    dtype: str
    numel: int
    slots: tuple[Slot, ...]


def plan_buckets(infos: Iterable[TensorInfo], bucket_bytes: int) -> list[Bucket]:
    """The tensors, in order, packed into buckets of one dtype and at most `bucket_bytes` (a larger tensor alone)."""
    buckets: list[Bucket] = []
    slots: list[Slot] = []
    dtype, used = None, 0
    for info in infos:
        numel = math.prod(info.shape)
        size = DTYPES[info.dtype].itemsize
        if slots and (info.dtype != dtype or (used + numel) * size > bucket_bytes):
            buckets.append(Bucket(dtype, used, tuple(slots)))
            slots, used = [], 0
        dtype = info.dtype
        slots.append(Slot(info.name, tuple(info.shape), used, numel))
        used += numel
    if slots:
        buckets.append(Bucket(dtype, used, tuple(slots)))
    return buckets


def tensor_infos(named: Iterable[tuple[str, torch.Tensor]]) -> list[TensorInfo]:
    return [TensorInfo(name, tuple(tensor.shape), str(tensor.dtype)) for name, tensor in named]


def open_weight_group(device: torch.device, rank: int, world_size: int, master_addr: str,
                      master_port: int) -> dist.ProcessGroup:
    """This process's member of the trainer → rollout group (blocks until all `world_size` have joined).

    A group of its own, beside the process group of the worker's role (not the default group): the
    actor's ranks and the rollout's ranks are in different default groups. Rank 0 (actor rank 0)
    serves the store on the port engine.workers.cluster.device.listen_for_rendezvous opened.
    """
    from engine.workers.cluster.device import _rendezvous_sockets

    timeout = datetime.timedelta(seconds=SYNC_TIMEOUT_S)
    listening = _rendezvous_sockets.pop(master_port, None) if rank == 0 else None
    try:
        store = dist.TCPStore(master_addr, master_port, world_size, is_master=rank == 0, timeout=timeout,
                              master_listen_fd=listening.fileno() if listening is not None else None)
    finally:
        if listening is not None:
            listening.detach()  # the store's server owns the descriptor now (see join_process_group)
    store = dist.PrefixStore("rlconf-weights", store)
    if device.type == "cuda":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        group = dist.ProcessGroupNCCL(store, rank, world_size, options)
    else:
        group = dist.ProcessGroupGloo(store, rank, world_size, timeout)
    return group


def send_weights(group: dist.ProcessGroup, named: Iterable[tuple[str, torch.Tensor]], buckets: list[Bucket],
                 device: torch.device) -> int:
    """Rank 0: pack `named` (in the layout's order) bucket by bucket and broadcast each; returns the bytes sent."""
    tensors = iter(named)
    sent = 0
    for bucket in buckets:
        flat = torch.empty(bucket.numel, dtype=DTYPES[bucket.dtype], device=device)
        for slot in bucket.slots:
            name, tensor = next(tensors)
            if name != slot.name or tuple(tensor.shape) != slot.shape:
                raise RuntimeError(f"weight push: the actor yielded {name} {tuple(tensor.shape)} where the layout "
                                   f"agreed at start-up has {slot.name} {slot.shape}")
            flat[slot.offset:slot.offset + slot.numel].copy_(tensor.reshape(-1))
        group.broadcast(flat, 0).wait()
        sent += flat.numel() * flat.element_size()
    leftover = next(tensors, None)
    if leftover is not None:
        raise RuntimeError(f"weight push: the actor yielded {leftover[0]}, which the layout agreed at start-up lacks")
    return sent


def receive_weights(group: dist.ProcessGroup, buckets: list[Bucket], device: torch.device
                    ) -> Iterator[tuple[str, torch.Tensor]]:
    """A rollout rank: each bucket as it arrives, unpacked into (name, tensor) views for the backend's load_weights."""
    for bucket in buckets:
        flat = torch.empty(bucket.numel, dtype=DTYPES[bucket.dtype], device=device)
        group.broadcast(flat, 0).wait()
        for slot in bucket.slots:
            yield slot.name, flat[slot.offset:slot.offset + slot.numel].view(slot.shape)
