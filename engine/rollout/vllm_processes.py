"""vLLM in processes of its own beside the actor on the same GPU: how the actor's weights reach its model.

With `rollout.engine_kwargs.vllm.distributed_executor_backend: mp` (verl 0.9.1's layout) the actor worker keeps
only vLLM's front end; the engine core (the scheduler) and the model runner each run in a process of their own,
so scheduling, the model's inputs and the outputs' bookkeeping overlap instead of taking turns in one thread
(docs/benchmarks.md, 2026-11-28 night: workload 1's generation 1.26 s against 2.23-2.32 s in process, log-probs
on in both). The weights then cannot be handed to vLLM's model object: they cross by CUDA IPC instead.

- The actor worker fills a flat byte buffer on its GPU (`WeightBuffer`) and shares it: its IPC handle
  travels as plain bytes and integers (`ipc_handle` / `buffer_from_handle`), since vLLM's RPC to its engine core
  encodes arguments with msgpack, not pickle.
- A push copies the gathered tensors into the buffer one at a time, in order (`WeightBuffer.push`), and whenever
  the next would not fit, and at the end, calls the model runner (`RolloutWorkerExtension.rlconf_load_bucket`,
  through `LLM.collective_rpc`) with each tensor's name, dtype, shape and byte offset; the model runner opens the
  buffer once, views the tensors in place and loads them with vLLM's own loader, then waits for its copies before
  it answers (the buffer is refilled next).
- The buffer lives while a push runs (update_weights_bucket_megabytes, or the last push's bytes if fewer; a tensor
  larger than that gets a buffer of its size) and is dropped by both processes at its end, so training has the
  memory back. It is shared once per allocation (see WeightBuffer).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple

import torch

ALIGN = 256  # bytes: every tensor starts at an offset any dtype's view (and vectorized copy) accepts
EXTENSION = "engine.rollout.vllm_processes.RolloutWorkerExtension"


class Entry(NamedTuple):
    """One tensor in the buffer; plain types only (it travels through vLLM's msgpack RPC)."""
    name: str
    dtype: str  # "bfloat16", "float32", ...: torch.<dtype>
    shape: list[int]
    offset: int  # bytes into the buffer


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def dtype_of(name: str) -> torch.dtype:
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        raise ValueError(f"not a torch dtype: {name!r}")
    return dtype


def aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def copy_into(buffer: torch.Tensor, offset: int, tensor: torch.Tensor) -> None:
    """The tensor's bytes into the uint8 buffer at `offset`."""
    nbytes = tensor.numel() * tensor.element_size()
    buffer[offset: offset + nbytes].copy_(tensor.detach().contiguous().view(-1).view(torch.uint8))


def views(buffer: torch.Tensor, entries: Iterable[Entry]) -> Iterator[tuple[str, torch.Tensor]]:
    """The tensors of `entries` as views into the uint8 buffer (no copy)."""
    for entry in entries:
        dtype = dtype_of(entry.dtype)
        numel = 1
        for size in entry.shape:
            numel *= size
        nbytes = numel * dtype.itemsize
        yield entry.name, buffer[entry.offset: entry.offset + nbytes].view(dtype).view(entry.shape)


# --- the buffer's CUDA IPC handle, in plain types --------------------------------------------

def ipc_handle(reduction_args: tuple) -> dict[str, Any]:
    """torch's `reduce_tensor` arguments for a flat uint8 CUDA tensor (rebuild_cuda_tensor's signature) as a dict
    of bytes, ints and bools."""
    (_cls, size, _stride, tensor_offset, _storage_cls, dtype, device, handle, storage_bytes, storage_offset,
     _grad, ref_handle, ref_offset, event_handle, event_sync) = reduction_args
    if dtype != torch.uint8 or len(size) != 1 or tensor_offset != 0:
        raise ValueError(f"the weight buffer is a flat uint8 tensor at its storage's start, not {dtype} {tuple(size)} "
                         f"at {tensor_offset}")
    return {"numel": int(size[0]), "device": int(device), "handle": bytes(handle), "storage_bytes": int(storage_bytes),
            "storage_offset": int(storage_offset), "ref_handle": bytes(ref_handle), "ref_offset": int(ref_offset),
            "event_handle": None if event_handle is None else bytes(event_handle), "event_sync": bool(event_sync)}


def reduction_args(handle: dict[str, Any]) -> tuple:
    """The inverse of `ipc_handle`: rebuild_cuda_tensor's arguments."""
    return (torch.Tensor, torch.Size([handle["numel"]]), (1,), 0, torch.storage.TypedStorage, torch.uint8,
            handle["device"], handle["handle"], handle["storage_bytes"], handle["storage_offset"], False,
            handle["ref_handle"], handle["ref_offset"], handle["event_handle"], handle["event_sync"])


def share(buffer: torch.Tensor) -> dict[str, Any]:
    from torch.multiprocessing.reductions import reduce_tensor

    _rebuild, args = reduce_tensor(buffer)
    return ipc_handle(args)


def buffer_from_handle(handle: dict[str, Any]) -> torch.Tensor:
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    return rebuild_cuda_tensor(*reduction_args(handle))


class WeightBuffer:
    """The actor worker's side of a push: a byte buffer on its GPU, shared while the push runs.

    The buffer is shared once per allocation: each `reduce_tensor` of a CUDA storage starts a reference count that
    only the receiver's opening of that very handle settles, so a handle shared again and never opened would keep
    the block from ever being freed (torch's CudaIPCSentData limbo). The tensors are copied in one at a time as
    the gather yields them, so the push holds the buffer and one gathered tensor, not a bucket's worth of both."""

    def __init__(self, bucket_bytes: int, device: torch.device | str = "cuda") -> None:
        self.bucket_bytes, self.device = bucket_bytes, torch.device(device)
        self.buffer: torch.Tensor | None = None
        self.handle: dict[str, Any] | None = None
        self.generation = 0  # bumped whenever a buffer is made: the model runner opens the new one
        self.pushed_bytes: int | None = None  # the last push's: the next buffer need be no larger

    def _allocate(self, nbytes: int, drop: Callable[[], None]) -> None:
        if self.buffer is not None:  # the model runner lets go of the smaller one first, then it is freed
            drop()
            self._free()
        self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        self.handle = share(self.buffer) if self.device.type == "cuda" else {"numel": nbytes}
        self.generation += 1

    def _free(self) -> None:
        self.buffer, self.handle = None, None
        if self.device.type == "cuda":
            torch.cuda.ipc_collect()  # a block whose reference count settled late leaves torch's limbo now

    def push(self, tensors: Iterable[tuple[str, torch.Tensor]], load: Callable[[dict[str, Any], int, list], None],
             drop: Callable[[], None]) -> int:
        """Copy `tensors` into the buffer in order and call `load(handle, generation, entries)` whenever the next one
        would not fit and at the end (the model runner loads from it and waits for its copies before it returns),
        then `drop()` (the model runner lets go of the buffer) and free it: between pushes neither process holds
        it, so training has that memory back. The buffer holds update_weights_bucket_megabytes, or the last push's
        bytes if fewer; a tensor larger than that gets a buffer of its size. Returns the bytes pushed."""
        capacity = min(self.bucket_bytes, self.pushed_bytes or self.bucket_bytes)
        entries: list[list[Any]] = []
        used = pushed = 0

        def flush() -> None:
            nonlocal used
            if entries:
                if self.device.type == "cuda":  # the bytes are there before the other process reads them
                    torch.cuda.current_stream(self.device).synchronize()
                load(self.handle, self.generation, list(entries))
                entries.clear()
            used = 0

        try:
            for name, tensor in tensors:
                nbytes = tensor.numel() * tensor.element_size()
                if self.buffer is not None and used + nbytes > self.buffer.numel():
                    flush()
                if self.buffer is None or nbytes > self.buffer.numel():
                    self._allocate(max(nbytes, capacity), drop)
                copy_into(self.buffer, used, tensor)
                entries.append([name, dtype_name(tensor.dtype), list(tensor.shape), used])
                used = aligned(used + nbytes)
                pushed += nbytes
            flush()
        finally:
            if self.buffer is not None:
                drop()
                self._free()
        self.pushed_bytes = pushed
        return pushed


class RolloutWorkerExtension:
    """Mixed into vLLM's GPU worker (`worker_extension_cls`) in the model runner's process; its methods are called
    by name through `LLM.collective_rpc`."""

    _rlconf_buffer: torch.Tensor | None = None
    _rlconf_generation = -1

    def rlconf_load_bucket(self, handle: dict[str, Any], generation: int, entries: list[list[Any]]) -> int:
        if generation != self._rlconf_generation:
            self._rlconf_buffer = None  # the superseded buffer's mapping goes first
            self._rlconf_buffer = buffer_from_handle(handle)
            self._rlconf_generation = generation
        model = self.model_runner.model  # type: ignore[attr-defined]
        with torch.no_grad():
            model.load_weights(weights=views(self._rlconf_buffer, [Entry(*entry) for entry in entries]))
        torch.cuda.synchronize()  # the buffer is refilled as soon as this returns
        return len(entries)

    def rlconf_drop_buffer(self) -> None:
        self._rlconf_buffer, self._rlconf_generation = None, -1

    def rlconf_pool_bytes(self) -> int:
        """Bytes in vLLM's sleep-mode pool (weights and KV cache), mapped or not."""
        from vllm.device_allocator.cumem import CuMemAllocator

        return CuMemAllocator.get_instance().get_current_usage()

    def rlconf_memory(self, reset_peak: bool = False) -> dict[str, int]:
        """This process's torch allocator: its peak since the last reset, and the pool's bytes."""
        peak = torch.cuda.max_memory_allocated()
        if reset_peak:
            torch.cuda.reset_peak_memory_stats()
        return {"peak_allocated": int(peak), "allocated": int(torch.cuda.memory_allocated()),
                "pool": self.rlconf_pool_bytes()}

    def rlconf_parameter_count(self) -> int:
        return sum(p.numel() for p in self.model_runner.model.parameters())  # type: ignore[attr-defined]
