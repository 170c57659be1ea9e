"""Host copies that stay: one page-locked block per dtype, a view of it for each offloaded tensor.

param_offload and optimizer_offload move a model's whole shard and Adam's moments to the host and back
every step. `.cpu()` allocates a fresh pageable tensor each time, and the kernel faults in and zeroes every
page of it while the copy waits: on one H200, 30.5 GB of 7B shards went to the host at 1.2-1.5 GB/s and came
back at 7-8 GB/s, against 55 GB/s each way into memory that stays page-locked (bench/offload_bandwidth.py,
docs/benchmarks.md). torch's pinned allocator gets that speed too, but it rounds every block up to a power
of two (the same shards kept 54 GiB of host memory), too much where the host is sized to the states. So the
copies here are views of one exact-size pageable block per dtype, page-locked once with cudaHostRegister.

The blocks stay for the life of the model: the host holds the states' bytes whether they are on the device
or not, which is also what `.cpu()` holds at its peak. Where the block cannot be page-locked, it stays
pageable (still allocated once: 14 GB/s to the host there) and a warning says so.
"""

from __future__ import annotations

import logging
import weakref
from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local shard, any other tensor itself."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def with_local(like: torch.Tensor, local: torch.Tensor) -> torch.Tensor:
    """`local` in `like`'s place: a DTensor with `like`'s sharding around it, or `local` itself.

    DTensor.from_local would move a host tensor back to the mesh's device; the constructor keeps it where
    it is, as `.cpu()` on a DTensor does (FSDP2's own `_from_local_no_grad` builds its DTensors so).
    """
    if isinstance(like, DTensor):
        return DTensor(local, like._spec, requires_grad=False)
    return local


def layout(tensors: Sequence[torch.Tensor]) -> tuple[tuple[tuple[int, ...], torch.dtype], ...]:
    """What a set of host copies must match: each tensor's shape and dtype, in order."""
    return tuple((tuple(t.shape), t.dtype) for t in tensors)


def _unregister(block: torch.Tensor) -> None:
    torch.cuda.cudart().cudaHostUnregister(block.data_ptr())


class HostCopies:
    """One host view for each tensor given (same shape and dtype, contiguous), cut from one block per dtype.

    `page_lock`: register each block with CUDA (on a GPU run); the registration ends when this object goes.
    """

    _warned = False

    def __init__(self, tensors: Sequence[torch.Tensor], *, page_lock: bool) -> None:
        self.layout = layout(tensors)
        totals: dict[torch.dtype, int] = {}
        for t in tensors:
            totals[t.dtype] = totals.get(t.dtype, 0) + t.numel()
        self.blocks = {dtype: torch.empty(total, dtype=dtype) for dtype, total in totals.items()}
        self.page_locked = page_lock and all(self._page_lock(block) for block in self.blocks.values())
        taken = dict.fromkeys(totals, 0)
        self.views: list[torch.Tensor] = []
        for t in tensors:
            start = taken[t.dtype]
            self.views.append(self.blocks[t.dtype][start:start + t.numel()].view(t.shape))
            taken[t.dtype] = start + t.numel()

    @property
    def nbytes(self) -> int:
        return sum(block.numel() * block.element_size() for block in self.blocks.values())

    def _page_lock(self, block: torch.Tensor) -> bool:
        if block.numel() == 0:
            return True
        error = torch.cuda.cudart().cudaHostRegister(block.data_ptr(), block.numel() * block.element_size(), 0)
        if int(error) != 0:
            if not HostCopies._warned:
                HostCopies._warned = True
                log.warning("could not page-lock %.1f GiB of host memory for offloaded states (CUDA error %s); "
                            "they wait in pageable memory, which crosses PCIe several times slower",
                            block.numel() * block.element_size() / 2**30, int(error))
            return False
        # Unregistered when this object is collected, before the block itself is freed (the finalizer holds it).
        weakref.finalize(self, _unregister, block)
        return True


class Mirror:
    """The host copies of a changing set of tensors: kept while their layout stays, made again when it changes."""

    def __init__(self, *, page_lock: bool) -> None:
        self.page_lock = page_lock
        self.copies: HostCopies | None = None

    def views_for(self, tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        if self.copies is None or self.copies.layout != layout(tensors):
            if self.copies is not None and self.page_lock:
                # A copy to the device may still read the old block: let it finish before the block goes.
                torch.cuda.synchronize()
            self.copies = None
            self.copies = HostCopies(tensors, page_lock=self.page_lock)
        return self.copies.views
