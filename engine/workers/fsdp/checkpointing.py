"""The worker side of checkpoints: FSDP2 models and optimizers sharded with DCP, plus per-rank state.

A worker class mixes in `CheckpointingWorker` and says what it trains in `_checkpointables()`:
`{"actor": (model, optimizer, scheduler)}`. Each entry becomes one subdirectory of the step
directory the controller hands over (engine.checkpoint owns the layout and the atomic commit):

    <step dir>/actor/.metadata, __<rank>_0.distcp   model + optimizer, each rank writes its own shards
    <step dir>/actor/extra_state_rank_<r>.pt        that rank's LR scheduler and RNG states
    <step dir>/actor/huggingface/                    with checkpoint.save_contents: [..., hf_model]

torch.distributed.checkpoint (DCP) writes every rank's shards in parallel, without gathering the
model anywhere, and can load them back into a different world size. Every method here is a
collective over the worker group: all ranks must call it.
"""

from __future__ import annotations

import os
import random
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_state_dict,
    set_model_state_dict,
    set_state_dict,
)

from rlconf.resolved import ResolvedPlan
from rlconf.schema.actor import CheckpointContents

Checkpointable = tuple[nn.Module, torch.optim.Optimizer, Any]  # (FSDP2 model, optimizer, LR scheduler)
HF_SUBDIR = "huggingface"  # <name>/huggingface/: the HF export of checkpoint.save_contents' hf_model


def extra_state_file(role_dir: Path, rank: int) -> Path:
    return role_dir / f"extra_state_rank_{rank}.pt"


def checkpoint_contents(resolved: ResolvedPlan, name: str) -> CheckpointContents:
    """The plan's `checkpoint` section (save_contents, load_contents) of a checkpointed model."""
    plan = resolved.config
    return {"actor": plan.actor_rollout_ref.actor.checkpoint, "critic": plan.critic.checkpoint}[name]


# --- RNG state of one process ------------------------------------------------------------------

def capture_rng_state(generators: dict[str, torch.Generator] | None = None) -> dict[str, Any]:
    """Every random stream of this process, in types `torch.load(weights_only=True)` accepts.

    Sampling (HF generate) draws from the global torch generator, which each rank seeded
    differently; python `random` and numpy are saved too because reward functions or data code
    may draw from them. `generators` are private torch.Generator objects (e.g. a shuffle stream).
    """
    state: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "python": random.getstate(),
        "generators": {name: gen.get_state() for name, gen in (generators or {}).items()},
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    try:
        import numpy as np
    except ImportError:
        pass
    else:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = (name, keys.tolist(), pos, has_gauss, cached)
    return state


def restore_rng_state(state: dict[str, Any], generators: dict[str, torch.Generator] | None = None) -> None:
    torch.set_rng_state(state["torch"])
    # getstate() returns tuples; a round trip through torch.save may hand back lists.
    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    for name, gen in (generators or {}).items():
        if name in state["generators"]:
            gen.set_state(state["generators"][name])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.asarray(keys, dtype=np.uint32), pos, has_gauss, cached))


def save_torch_file(obj: Any, path: Path) -> None:
    """torch.save, then fsync: the controller's rename must not publish a file still in the page cache."""
    with open(path, "wb") as handle:
        torch.save(obj, handle)
        handle.flush()
        os.fsync(handle.fileno())


# --- the mixin ---------------------------------------------------------------------------------

class CheckpointingWorker:
    """save_checkpoint / load_checkpoint / export_hf for a worker with `resolved`, `rank` and `_checkpointables()`."""

    resolved: ResolvedPlan
    rank: int
    # Each worker class defines what it checkpoints: name -> (FSDP model, optimizer, LR scheduler).
    _checkpointables: Callable[[], dict[str, Checkpointable]]

    def _after_checkpoint_load(self) -> None:
        """Hook for state derived from the loaded weights (the actor refreshes its rollout copy)."""

    def _hf_export_state(self, name: str, full_state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """Hook: the full state dict `export_hf` writes for `name` (the actor merges its LoRA adapters)."""
        return full_state

    def _on_device_for_checkpoint(self) -> AbstractContextManager:
        """Hook: inside it, offloaded shards and optimizer states are on the device (engine.workers.fsdp.offload),
        so saving, loading and exporting see every state where FSDP2 and the optimizer expect it."""
        return nullcontext()

    def _params_on_device_for_export(self) -> AbstractContextManager:
        """Hook: inside it, offloaded shards are on the device (the export gathers the weights alone: Adam's moments
        stay where they are)."""
        return nullcontext()

    def _release_optimizers(self) -> None:
        """Hook: drop every optimizer's moments and gradients, and whatever holds them off the device."""
        for _, optimizer, _ in self._checkpointables().values():
            optimizer.zero_grad(set_to_none=True)
            optimizer.state.clear()

    def release_optimizer(self) -> dict[str, Any]:
        """Training is over (the trainer's final export calls this first): the optimizers' states go, so the
        export's full weights have the memory they held. No update (the offload refuses its optimizer step) and no
        checkpoint (it would hold no moments: a resume would restart Adam) may follow."""
        self._release_optimizers()
        self._optimizer_released = True
        return {"rank": self.rank}

    def _rng_generators(self) -> dict[str, torch.Generator]:
        # Every torch.Generator the worker holds is a random stream a resume must continue, so they
        # are found by type rather than listed by hand (a new one cannot be forgotten).
        return {name: value for name, value in vars(self).items() if isinstance(value, torch.Generator)}

    def save_checkpoint(self, step_dir: str) -> dict[str, Any]:
        """Write every checkpointable under `step_dir/<name>/`; returns this rank's seconds per name.

        Always model, optimizer and extra (scheduler, RNG): the engine refuses plans whose
        `checkpoint.save_contents` leaves one out. `hf_model` adds `<name>/huggingface/`.
        """
        if getattr(self, "_optimizer_released", False):
            raise RuntimeError("save_checkpoint() after release_optimizer(): the checkpoint would hold no Adam "
                               "moments, and a resume from it would restart them from zero")
        seconds = {}
        with self._on_device_for_checkpoint():
            for name, (model, optimizer, scheduler) in self._checkpointables().items():
                start = time.perf_counter()
                role_dir = Path(step_dir) / name
                role_dir.mkdir(parents=True, exist_ok=True)
                model_state, optimizer_state = get_state_dict(model, optimizer)
                dcp.save({"model": model_state, "optimizer": optimizer_state}, checkpoint_id=role_dir)
                # The scheduler is the same on every rank, but a per-rank file keeps loading local.
                save_torch_file({"scheduler": scheduler.state_dict(),
                                 "rng": capture_rng_state(self._rng_generators())},
                                extra_state_file(role_dir, self.rank))
                if "hf_model" in checkpoint_contents(self.resolved, name).save_contents:
                    self.export_hf(name, str(role_dir / HF_SUBDIR))
                seconds[name] = time.perf_counter() - start
        return {"rank": self.rank, "seconds": seconds}

    def load_checkpoint(self, step_dir: str) -> dict[str, Any]:
        """Load what `checkpoint.load_contents` lists from `step_dir/<name>/`, RNG streams last.

        model: the weights. optimizer: its moments and step counts (else it starts fresh). extra: the
        LR scheduler and this rank's RNG streams (else the schedule restarts and sampling is reseeded).
        A rank the checkpoint did not have (it was written by a smaller group: DCP reshards the
        weights) takes rank 0's scheduler and keeps its own fresh RNG streams.
        """
        rng_state = None
        with self._on_device_for_checkpoint():
            for name, (model, optimizer, scheduler) in self._checkpointables().items():
                contents = checkpoint_contents(self.resolved, name).load_contents
                role_dir = Path(step_dir) / name
                if not (role_dir / ".metadata").is_file():
                    raise FileNotFoundError(f"{role_dir} holds no {name} checkpoint (no DCP .metadata file)")
                if "optimizer" in contents:
                    model_state, optimizer_state = get_state_dict(model, optimizer)
                    state = {"model": model_state, "optimizer": optimizer_state}
                    dcp.load(state, checkpoint_id=role_dir)
                    set_state_dict(model, optimizer, model_state_dict=state["model"],
                                   optim_state_dict=state["optimizer"])
                else:
                    state = {"model": get_model_state_dict(model)}
                    dcp.load(state, checkpoint_id=role_dir)
                    set_model_state_dict(model, state["model"])
                if "extra" in contents:
                    own_file = extra_state_file(role_dir, self.rank)
                    extra = torch.load(own_file if own_file.is_file() else extra_state_file(role_dir, 0),
                                       weights_only=True)
                    scheduler.load_state_dict(extra["scheduler"])
                    if own_file.is_file() and rng_state is None:
                        rng_state = extra["rng"]
            self._after_checkpoint_load()
        # Last: nothing after this point may draw a random number before the next training step.
        if rng_state is not None:
            restore_rng_state(rng_state, self._rng_generators())
        return {"rank": self.rank, "rng_restored": rng_state is not None}

    def export_hf(self, name: str, out_dir: str) -> None:
        """Gather `name`'s full weights on rank 0 and write them as a HF model directory (safetensors + config)."""
        model = self._checkpointables()[name][0]
        # cpu_offload: only rank 0 materializes the full tensors, the others get an empty dict. A checkpoint's export
        # runs inside its save, where everything is on the device already (the offload's contexts nest).
        with self._params_on_device_for_export():
            full_state = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        if self.rank != 0:
            return
        model.save_pretrained(out_dir, state_dict=self._hf_export_state(name, full_state))
        # fully_shard swaps the class for a generated `FSDP<Name>` subclass; transformers before 5
        # write that name into config.json, where loaders that dispatch on it (vLLM) do not know it.
        model.config.architectures = [type(model).__name__.removeprefix("FSDP")]
        model.config.save_pretrained(out_dir)
