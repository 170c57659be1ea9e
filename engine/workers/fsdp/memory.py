"""Peak memory of a worker process, reported per role as `memory/<role>_peak_gb`."""

from __future__ import annotations

import resource
import sys

import torch


def peak_memory_gb(device: str) -> float:
    """GiB at the high-water mark: allocated CUDA memory on cuda, resident set size on CPU.

    On CPU the process's max RSS is the honest number: model, optimizer state and activations
    all live in host memory, and a Ray worker is one process per role and rank.
    """
    if device == "cuda":
        return torch.cuda.max_memory_allocated() / 2**30
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    # Linux reports ru_maxrss in KiB, macOS in bytes.
    return max_rss / 2**30 if sys.platform == "darwin" else max_rss / 2**20


def allocated_memory_gb(device: str) -> float | None:
    """GiB this process holds on its CUDA device now (None on CPU, where only the peak RSS is honest): what a
    role keeps while the other roles sharing its GPU work."""
    return torch.cuda.memory_allocated() / 2**30 if device == "cuda" else None


def resident_metrics(role: str, device: str, uncounted_gb: float = 0.0) -> dict[str, float]:
    """`memory/<role>_resident_gb` on CUDA (less `uncounted_gb`, allocated but not the role's), else nothing."""
    allocated = allocated_memory_gb(device)
    return {} if allocated is None else {f"memory/{role}_resident_gb": allocated - uncounted_gb}


def release_cached_memory(device: str) -> None:
    """Give the caching allocator's free blocks back to the GPU. Each role is a process of its own here (verl's
    colocated roles share one process, whose rollout wake-up empties the one cache): a critic's or reward model's
    cached activations would otherwise stay reserved through the next rollout and reward scoring, where the
    actor's vLLM and a served reward model wake into that memory."""
    if device == "cuda":
        torch.cuda.empty_cache()


def reset_peak_memory(device: str) -> None:
    """Start a new high-water mark (CUDA only: a process's max RSS cannot be reset)."""
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
