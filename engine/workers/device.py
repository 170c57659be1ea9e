"""Where a worker computes: its torch device and its process group (gloo on CPU, NCCL on GPU).

Batches travel between the controller and the workers on the CPU (Ray serializes them); a worker
moves its shard to its device on the way in and its results back to the CPU on the way out.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

from engine.workers.batch import TensorBatch


def set_rendezvous_env(rank: int, world_size: int, master_port: int) -> None:
    """torch.distributed's env:// rendezvous on this node's loopback (every rank of a group is on one node)."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(master_port), RANK=str(rank),
                      WORLD_SIZE=str(world_size), LOCAL_RANK="0")
    # Single node: gloo's pair sockets otherwise bind to the hostname's (external) interface.
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")


def worker_device(device: str) -> torch.device:
    """The plan's trainer.device as this process's torch device.

    On GPU, Ray hands each worker its GPU through CUDA_VISIBLE_DEVICES, so it is always cuda:0 here.
    """
    if device == "cuda":
        if not torch.cuda.is_available():
            raise RuntimeError("trainer.device=cuda, but this worker process sees no CUDA device "
                               f"(CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')})")
        torch.cuda.set_device(0)
        return torch.device("cuda", 0)
    return torch.device("cpu")


def join_process_group(device: torch.device, rank: int, world_size: int) -> None:
    """Join the group (blocks until every rank has called it): NCCL between GPUs, gloo between CPU processes."""
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world_size)


def to_device(batch: TensorBatch, device: torch.device) -> TensorBatch:
    return {name: tensor.to(device, non_blocking=True) for name, tensor in batch.items()}


def to_cpu(batch: TensorBatch) -> TensorBatch:
    return {name: tensor.cpu() for name, tensor in batch.items()}
