"""Host copies that stay: one page-locked block per dtype, a view of it for each offloaded tensor.

param_offload and optimizer_offload move a model's whole shard and Adam's moments to the host and back
every step. `.cpu()` allocates a fresh pageable tensor each time, and the kernel faults in and zeroes every
page of it while the copy waits: on one H200, 30.5 GB of 7B shards went to the host at 1.2-1.5 GB/s and came
back at 7-8 GB/s, against 55 GB/s each way into memory that stays page-locked (bench/offload_bandwidth.py,
docs/benchmarks.md). torch's pinned allocator gets that speed too, but it rounds every block up to a power
of two (the same shards kept 54 GiB of host memory), too much where the host is sized to the states. So the
copies here are views of one exact-size pageable block per dtype, page-locked once with cudaHostRegister.

The blocks stay for the life of the model: the host holds the states' bytes whether they are on the device
or not, which is also what `.cpu()` holds at its peak. Each block spans whole pages of its own, so no two
registrations share a page. Where one cannot be page-locked, it stays pageable (still allocated once: 14
GB/s to the host there), CUDA's error is cleared, and a warning says so.
"""

from __future__ import annotations

import ctypes
import logging
import math
import mmap
import weakref
from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor

log = logging.getLogger(__name__)


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """The tensor this rank holds: a DTensor's local shard, any other tensor itself."""
    return tensor._local_tensor if isinstance(tensor, DTensor) else tensor


def evenly_sharded(tensor: torch.Tensor) -> bool:
    """Whether this rank's shard has the rows every rank's has (a plain tensor: yes).

    FSDP2 pads an uneven shard to that size on the device and, when the shard moves, again in a fresh tensor of
    its own (FSDPParam.reset_sharded_param): such a shard would leave its host copy at once, so it is not given one.
    """
    if not isinstance(tensor, DTensor):
        return True
    local = tensor._local_tensor
    for mesh_dim, placement in enumerate(tensor.placements):
        if placement.is_shard():
            dim = placement.dim
            if local.size(dim) != math.ceil(tensor.size(dim) / tensor.device_mesh.size(mesh_dim)):
                return False
    return True


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


def _unregister(region: torch.Tensor) -> None:
    try:
        torch.cuda.synchronize()  # a copy to the device may still read the block (a model dropped inside `in_use`)
        torch.cuda.cudart().cudaHostUnregister(region.data_ptr())
    except Exception:  # noqa: BLE001 - at interpreter exit CUDA may be gone already; the process frees it all
        pass


def _page_region(nbytes: int) -> torch.Tensor:
    """`nbytes` (rounded up to whole pages) of host memory that starts on a page: pages no other allocation uses."""
    page = mmap.PAGESIZE
    rounded = max(1, math.ceil(nbytes / page)) * page
    raw = torch.empty(rounded + page, dtype=torch.uint8)
    offset = -raw.data_ptr() % page
    return raw[offset:offset + rounded]


def _clear_cuda_error() -> bool:
    """Reset the CUDA runtime's last error, which a failed cudaHostRegister leaves set (torch's next kernel-launch
    check would raise it). torch's cudart binding has no cudaGetLastError: it is called in the libcudart this
    process loaded. False where that library is not found."""
    try:
        with open("/proc/self/maps") as maps:
            paths = {line.split()[-1] for line in maps if "libcudart" in line}
        for path in paths:
            ctypes.CDLL(path).cudaGetLastError()
        return bool(paths)
    except OSError:
        return False


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
        self.blocks: dict[torch.dtype, torch.Tensor] = {}
        self.page_locked = page_lock
        for dtype, total in totals.items():
            region = _page_region(total * dtype.itemsize)
            self.blocks[dtype] = region[:total * dtype.itemsize].view(dtype)
            if page_lock:
                self.page_locked = self._page_lock(region) and self.page_locked
        taken = dict.fromkeys(totals, 0)
        self.views: list[torch.Tensor] = []
        for t in tensors:
            start = taken[t.dtype]
            self.views.append(self.blocks[t.dtype][start:start + t.numel()].view(t.shape))
            taken[t.dtype] = start + t.numel()

    @property
    def nbytes(self) -> int:
        return sum(block.numel() * block.element_size() for block in self.blocks.values())

    def _page_lock(self, region: torch.Tensor) -> bool:
        error = torch.cuda.cudart().cudaHostRegister(region.data_ptr(), region.numel(), 0)
        if int(error) != 0:
            if not _clear_cuda_error():
                raise RuntimeError(f"could not page-lock {region.numel() / 2**30:.1f} GiB of host memory for "
                                   f"offloaded states (CUDA error {int(error)}), nor clear that error")
            if not HostCopies._warned:
                HostCopies._warned = True
                log.warning("could not page-lock %.1f GiB of host memory for offloaded states (CUDA error %s); "
                            "they wait in pageable memory, which crosses PCIe several times slower",
                            region.numel() / 2**30, int(error))
            return False
        # Unregistered when this object is collected, before the region itself is freed (the finalizer holds it).
        weakref.finalize(self, _unregister, region)
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
