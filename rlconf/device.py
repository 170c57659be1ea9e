"""This machine's GPU, read without importing torch or opening a CUDA context: for `rlconf launch`'s
memory checks and `rlconf tune`, which stays as light as `validate`."""

from __future__ import annotations

from typing import NamedTuple


class LocalGpu(NamedTuple):
    name: str
    memory_gib: float  # total memory of the smallest GPU of this machine


def local_gpu() -> LocalGpu | None:
    """This machine's GPU as nvidia-smi reports it (None: no NVIDIA GPU, or no nvidia-smi).

    nvidia-smi, not torch.cuda: the launch's own process must not open a CUDA context on GPU 0,
    which the first worker's training and rollout share.
    """
    out = smi_query("name,memory.total")
    if out is None:
        return None
    gpus = [line.rsplit(",", 1) for line in out.strip().splitlines() if "," in line]
    try:
        name, mib = min(((name.strip(), float(mib)) for name, mib in gpus), key=lambda gpu: gpu[1])
    except ValueError:  # no line, or a number nvidia-smi could not read ("[N/A]")
        return None
    return LocalGpu(name, mib / 1024)


def local_gpu_count() -> int | None:
    """The NVIDIA GPUs this process may use: nvidia-smi's count, cut to CUDA_VISIBLE_DEVICES's indices as CUDA reads
    them; None where nvidia-smi cannot be run or the variable names devices otherwise (the caller asks torch then)."""
    out = smi_query("index")
    if out is None:
        return None
    count = sum(1 for line in out.splitlines() if line.strip())
    indices = visible_gpu_indices(count)
    return None if indices is None else len(indices)


def visible_gpu_indices(count: int) -> list[int] | None:
    """The indices of the `count` GPUs nvidia-smi lists that this process may use, as CUDA reads
    CUDA_VISIBLE_DEVICES; None where the variable names devices otherwise than by index (torch then decides)."""
    import os

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is None:
        return list(range(count))
    entries = [entry.strip() for entry in visible.split(",")]
    if any(entry and not entry.isdigit() and not entry.startswith("-") for entry in entries):
        return None  # GPU UUIDs, MIG devices, "NoDevFiles": torch (CUDA's own reading) decides
    indices: list[int] = []
    for entry in entries:  # as CUDA reads it: up to the first invalid index; a repeated one hides every GPU
        if not entry or entry.startswith("-") or int(entry) >= count:
            break
        if int(entry) in indices:
            return []
        indices.append(int(entry))
    return indices


def smi_query(fields: str) -> str | None:
    """nvidia-smi's answer for `--query-gpu=<fields>`, a CSV line a GPU without header or units; None where
    nvidia-smi is missing or fails."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        return subprocess.run([smi, f"--query-gpu={fields}", "--format=csv,noheader,nounits"], capture_output=True,
                              text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
