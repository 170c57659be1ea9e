"""vLLM in processes of its own beside the actor on the same GPU: how the actor's weights reach its model.

With `rollout.engine_kwargs.vllm.distributed_executor_backend: mp` (verl 0.9.1's layout) the actor worker keeps
only vLLM's front end; the engine core (the scheduler) and the model runner each run in a process of their own,
so scheduling, the model's inputs and the outputs' bookkeeping overlap instead of taking turns in one thread
(docs/benchmarks.md, 2026-11-28 night: workload 1's generation 1.26 s against 2.23-2.32 s in process, log-probs
on in both). The weights then cannot be handed to vLLM's model object: they cross by CUDA IPC instead.

- The actor worker fills a flat byte buffer on its GPU (`WeightBuffer`) and shares it: its IPC handle
  travels as plain bytes and integers (`ipc_handle` / `buffer_from_handle`), since vLLM's RPC to its engine core
  encodes arguments with msgpack, not pickle.
- A push packs the gathered tensors into the buffer in order (`pack`), and after each full buffer calls the
  model runner (`RolloutWorkerExtension.rlconf_load_bucket`, through `LLM.collective_rpc`) with each tensor's
  name, dtype, shape and byte offset; the model runner opens the buffer once, views the tensors in place and
  loads them with vLLM's own loader, then waits for its copies before it answers (the buffer is refilled next).
- The buffer lives while a push runs (at most update_weights_bucket_megabytes, or the model's size if smaller; a
  tensor larger than that alone) and is dropped by both processes at its end, so training has the memory back.
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


def pack(tensors: Iterable[tuple[str, torch.Tensor]], buffer_bytes: int,
         flush: Callable[[list[tuple[Entry, torch.Tensor]]], None]) -> int:
    """Group the tensors, in order, into runs that fit `buffer_bytes` (offsets aligned to ALIGN); call `flush` with
    each run's (entry, tensor) pairs, the tensor larger than the buffer alone. Returns the largest run's bytes:
    what the buffer must hold. Each run is flushed before the next one's tensors are taken from the iterable, so
    a generator of gathered tensors holds at most one run on the GPU."""
    run: list[tuple[Entry, torch.Tensor]] = []
    used = largest = 0
    for name, tensor in tensors:
        nbytes = tensor.numel() * tensor.element_size()
        if run and used + nbytes > buffer_bytes:
            flush(run)
            largest, run, used = max(largest, used), [], 0
        run.append((Entry(name, dtype_name(tensor.dtype), list(tensor.shape), used), tensor))
        used = aligned(used + nbytes)
    if run:
        flush(run)
        largest = max(largest, used)
    return largest


def copy_into(buffer: torch.Tensor, run: list[tuple[Entry, torch.Tensor]]) -> None:
    """Each tensor's bytes into the uint8 buffer at its entry's offset."""
    for entry, tensor in run:
        nbytes = tensor.numel() * tensor.element_size()
        buffer[entry.offset: entry.offset + nbytes].copy_(tensor.detach().contiguous().view(-1).view(torch.uint8))


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
    """The actor worker's side of a push: a byte buffer on its GPU, shared while the push runs."""

    def __init__(self, bucket_bytes: int, device: torch.device | str = "cuda") -> None:
        self.bucket_bytes, self.device = bucket_bytes, torch.device(device)
        self.buffer: torch.Tensor | None = None
        self.generation = 0  # bumped whenever a buffer is made: the model runner opens the new one

    def _room_for(self, nbytes: int) -> None:
        if self.buffer is None or self.buffer.numel() < nbytes:
            self.buffer = None  # a smaller one's memory back first
            self.buffer = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
            self.generation += 1

    def push(self, tensors: Iterable[tuple[str, torch.Tensor]], load: Callable[[dict[str, Any], int, list], None],
             drop: Callable[[], None]) -> int:
        """Pack `tensors` and call `load(handle, generation, entries)` once per full buffer (the model runner loads
        from it and waits for its copies before it returns), then `drop()` (the model runner lets go of the buffer)
        and free it: between pushes neither process holds it, so training has that memory back. Returns the bytes
        pushed."""
        pushed = 0

        def flush(run: list[tuple[Entry, torch.Tensor]]) -> None:
            nonlocal pushed
            entry, tensor = run[-1]
            self._room_for(entry.offset + tensor.numel() * tensor.element_size())
            copy_into(self.buffer, run)
            if self.device.type == "cuda":  # the bytes are there before the other process reads them
                torch.cuda.current_stream(self.device).synchronize()
            load(share(self.buffer), self.generation, [list(entry) for entry, _ in run])
            pushed += sum(t.numel() * t.element_size() for _, t in run)

        try:
            pack(tensors, self.bucket_bytes, flush)
        finally:
            if self.buffer is not None:
                drop()
                self.buffer = None
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
