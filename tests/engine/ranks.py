"""Start the processes of a multi-rank test (gloo on CPU) without each one importing torch anew.

`torch.multiprocessing.spawn` starts a fresh interpreter per rank, and each imports torch,
transformers and the engine's worker modules: about 4 s of CPU a process, so 8-10 s of a 4-rank
test on 2 cores before any rank computes. Here the ranks are forked from Python's forkserver, which
imports those modules once per test session. The forkserver is a clean single-threaded process
(it never ran a torch op, so no OpenMP pool is forked), and each rank still gets the parent's
sys.path, working directory and environment as they are at the call, as a spawned rank does.
"""

from __future__ import annotations

import functools
import multiprocessing
import os
from collections.abc import Callable
from typing import Any

# What the ranks of tests/engine import; a module missing here is imported by the rank itself (slower, same result).
PRELOAD = [
    "torch", "torch.distributed", "torch.distributed.fsdp", "torch.distributed.checkpoint", "transformers",
    "transformers.models.qwen2.modeling_qwen2", "engine.models.loading", "engine.workers.fsdp.sharding",
    "engine.workers.roles.actor_rollout_ref", "engine.workers.roles.critic", "engine.workers.roles.reward_model",
]


def _in_callers_environ(environ: dict[str, str], fn: Callable[..., Any], *args: Any) -> Any:
    os.environ.clear()
    os.environ.update(environ)  # the caller's environment at the call, not the forkserver's when it started
    return fn(*args)


def rank_context() -> multiprocessing.context.BaseContext:
    """The forkserver context; its server imports PRELOAD when it starts (the first process of the session)."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    return multiprocessing.get_context("forkserver")


def rank_target(fn: Callable[..., Any]) -> Callable[..., Any]:
    """`fn` as a Process target of rank_context() that runs in the caller's environment (as a spawned one would)."""
    return functools.partial(_in_callers_environ, dict(os.environ), fn)


def spawn_ranks(fn: Callable[..., Any], args: tuple = (), nprocs: int = 1) -> None:
    """As `torch.multiprocessing.spawn(fn, args, nprocs, join=True)`: `fn(rank, *args)` in `nprocs` processes;
    an exception in any rank is raised here (torch.multiprocessing.ProcessRaisedException)."""
    import torch.multiprocessing as mp

    rank_context()
    mp.start_processes(rank_target(fn), args=args, nprocs=nprocs, join=True, start_method="forkserver")
