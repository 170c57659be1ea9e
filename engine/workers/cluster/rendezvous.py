"""Where the ranks of a worker group run on the cluster, how they meet, and what they must share.

These functions run inside a worker's Ray actor through `actor.__ray_call__` (they receive the actor,
engine.workers.cluster.lazy.LazyWorker, first), so the worker classes stay plain Python. Nothing here assumes one node:

- each rank reports the Ray node it landed on (`where_am_i`);
- rank 0 opens the rendezvous port on *its* node's address, as Ray knows it (`open_rendezvous`),
  and every rank meets there (`meet_at`): on a local run that is 127.0.0.1, on a cluster the
  address given to `ray start --node-ip-address` on rank 0's node;
- every rank reads a file the controller wrote into the run directory and writes one back
  (`probe_shared_dir`): checkpoints are written by every rank, so all nodes must see that directory.
"""

from __future__ import annotations

import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROBE_PREFIX = ".rlconf-shared-dir-check"


class SharedDirError(RuntimeError):
    """A worker cannot read or write the run directory (it is not on storage every node sees)."""


@dataclass(frozen=True)
class WorkerLocation:
    node_id: str  # Ray's node id (hex)
    node_ip: str  # the node's address on the cluster network, as Ray knows it
    pid: int
    gpu_ids: tuple[str, ...] = ()  # the GPUs Ray gave this worker (CUDA_VISIBLE_DEVICES); none on CPU

    def describe(self) -> str:
        return f"{self.node_ip} (Ray node {self.node_id[:12]})"


def where_am_i(_worker: Any) -> WorkerLocation:
    import ray

    context = ray.get_runtime_context()
    return WorkerLocation(context.get_node_id(), ray.util.get_node_ip_address(), os.getpid(),
                          tuple(context.get_accelerator_ids().get("GPU", ())))


def open_rendezvous(_worker: Any, node_ip: str) -> int:
    from engine.workers.cluster.device import listen_for_rendezvous

    return listen_for_rendezvous(node_ip)


def meet_at(_worker: Any, rank: int, world_size: int, master_addr: str, master_port: int, node_ip: str) -> None:
    from engine.workers.cluster.device import set_rendezvous_env

    set_rendezvous_env(rank, world_size, master_addr, master_port, node_ip)


def write_probe(run_dir: Path) -> tuple[Path, str]:
    """The controller's half of the shared-directory check: a file with a fresh token."""
    token = uuid.uuid4().hex
    probe = run_dir / f"{PROBE_PREFIX}-{token[:8]}"
    probe.write_text(token)
    return probe, token


def probe_shared_dir(_worker: Any, probe: str, token: str, reply: str) -> str | None:
    """A worker's half: read the controller's token, write it back under `reply`; a problem for people, or None."""
    try:
        seen = Path(probe).read_text()
    except OSError as exc:
        return f"cannot read {probe} ({type(exc).__name__}: {exc.strerror or exc})"
    if seen != token:
        return f"reads a different {probe} than the controller wrote (another directory at the same path)"
    try:
        Path(reply).write_text(token)
    except OSError as exc:
        return f"cannot write {reply} ({type(exc).__name__}: {exc.strerror or exc})"
    return None
