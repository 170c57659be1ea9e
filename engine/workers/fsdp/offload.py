"""CPU offload: where an FSDP2 model's shard, its optimizer's states and its saved activations wait.

verl's knobs, each its own mechanism:

- `fsdp_config.offload_policy`: FSDP2's CPUOffloadPolicy (engine.workers.fsdp.sharding.apply_fsdp). Sharded
  parameters, gradients and the optimizer step live on the CPU; each layer's shard is copied to the
  device for its all-gather. It supersedes the two knobs below, as in verl.
- `fsdp_config.param_offload` (`ModelOffload.params`): the shard waits on the CPU while the model is
  idle (rollout, the other models' passes) and comes to the device for the model's own forward
  passes, its update and checkpoints (`in_use`). Weight sync needs no visit: engine.workers.fsdp.gather
  copies a CPU shard to the device as it packs it into a bucket.
- `fsdp_config.optimizer_offload` (`ModelOffload.optimizer_states`): Adam's moments wait on the CPU
  except during each optimizer step (`optimizer_step`), when the micro batches' activations are gone.

  On a GPU both wait in host copies allocated once and page-locked (engine.workers.fsdp.host_copies):
  a fresh `.cpu()` copy every step crossed PCIe 7-46x slower (one H200).
- `model.enable_activation_offload` (`offload_activations`): the tensors a training forward saves
  for backward go to (pinned) CPU memory and come back when backward reads them. With gradient
  checkpointing those are mostly each decoder layer's input; the layer's recompute in backward
  stays on the device.

On a CPU run (trainer.device=cpu) the same code runs and saves nothing: the "device" is the CPU.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from typing import Any

import torch
from torch import nn
from torch.distributed.fsdp import FSDPModule

from engine.workers.fsdp.host_copies import Mirror, evenly_sharded, local_tensor, with_local


def _release_cached_memory(device: torch.device) -> None:
    """Hand what the offload freed back to the driver, so a rollout engine that allocates outside
    torch's cache (vLLM's sleep-mode pool) can use it."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _optimizer_state_entries(optimizer: torch.optim.Optimizer) -> list[tuple[dict, str]]:
    """(state, key) of every per-parameter state tensor that moves (Adam's moments, not its step counts)."""
    return [(state, key) for state in optimizer.state.values() for key, value in state.items()
            if isinstance(value, torch.Tensor) and value.dim() > 0]


def move_optimizer_states(optimizer: torch.optim.Optimizer, device: torch.device | str) -> None:
    """Move every per-parameter state tensor (Adam's moments) to `device`.

    0-dim tensors (Adam's step count) stay where the optimizer keeps them: a non-capturable Adam
    wants its step counts on the CPU.
    """
    for state, key in _optimizer_state_entries(optimizer):
        state[key] = state[key].to(device)


class ModelOffload:
    """param_offload / optimizer_offload of one FSDP2 model (and its optimizer, if it trains).

    `params`: the shard is on the CPU except inside `in_use()`. `optimizer_states`: Adam's moments
    are on the CPU except inside `optimizer_step()`. Both off: every method is a no-op.

    `host_copies` (default: on a GPU): the states wait in host copies allocated once and page-locked
    (engine.workers.fsdp.host_copies) instead of a fresh `.cpu()` tensor each time. On a CPU run the
    device is the host and `.cpu()` moves nothing; tests turn the copies on there to run their path.
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None, device: torch.device, *,
                 params: bool, optimizer_states: bool, host_copies: bool | None = None) -> None:
        self.model, self.optimizer, self.device = model, optimizer, device
        self.params, self.optimizer_states = params, optimizer_states and optimizer is not None
        self.host_copies = device.type == "cuda" if host_copies is None else host_copies
        page_lock = self.host_copies and device.type == "cuda"
        self._param_copies, self._moment_copies = Mirror(page_lock=page_lock), Mirror(page_lock=page_lock)
        self.released = False  # release_optimizer() was called: training is over
        # Both contexts may nest (a checkpoint's HF export runs inside the save): only the outermost moves.
        self._depth = self._checkpoint_depth = 0
        if self.params:
            self._params_to_host()
            _release_cached_memory(device)

    @classmethod
    def from_plan(cls, fsdp_config: Any, model: nn.Module, optimizer: torch.optim.Optimizer | None,
                  device: torch.device) -> ModelOffload:
        """A model's `fsdp_config` (the reference's has neither optimizer_offload nor offload_policy).

        offload_policy already keeps everything on the CPU: it supersedes the other two (as in verl).
        """
        policy = getattr(fsdp_config, "offload_policy", False)
        return cls(model, optimizer, device, params=fsdp_config.param_offload and not policy,
                   optimizer_states=getattr(fsdp_config, "optimizer_offload", False) and not policy)

    def _params_to_host(self) -> None:
        if not self.host_copies:
            self.model.cpu()  # FSDP2 re-registers the moved shards (FSDPModule._apply)
            return
        # The sharded parameters are the registered ones only once every FSDP module has resharded
        # (FSDPModule._apply reshards each module too, but only as the walk reaches it).
        for module in self.model.modules():
            if isinstance(module, FSDPModule):
                module.reshard()
        parameters = [p for p in self.model.parameters() if evenly_sharded(p)]
        views = self._param_copies.views_for([local_tensor(p.detach()) for p in parameters])
        view_of = {id(p): view for p, view in zip(parameters, views)}

        def to_host(tensor: torch.Tensor) -> torch.Tensor:
            view = view_of.get(id(tensor))
            if view is None:  # buffers, gradients where any are left, uneven shards: moved as `.cpu()` would
                return tensor.cpu()
            # Blocking: the host copy is whole before anything on the CPU can read the offloaded shard.
            view.copy_(local_tensor(tensor.detach()))
            return with_local(tensor, view)

        # nn.Module._apply swaps each parameter's contents in place, and FSDP2 re-registers the shards.
        self.model._apply(to_host)

    def _params_to_device(self) -> None:
        if not self.host_copies:
            self.model.to(self.device)
            return
        # From page-locked memory the copies run asynchronously, in the current stream's order. `copy`: a
        # CPU run that turns the copies on gets separate tensors too, so the host copies are only read here.
        self.model._apply(lambda tensor: tensor.to(self.device, non_blocking=True, copy=True))

    def _moments_to_device(self) -> None:
        if not self.host_copies:
            move_optimizer_states(self.optimizer, self.device)
            return
        for state, key in _optimizer_state_entries(self.optimizer):
            state[key] = state[key].to(self.device, non_blocking=True, copy=True)

    def _moments_to_host(self) -> None:
        if not self.host_copies:
            move_optimizer_states(self.optimizer, "cpu")
            return
        entries = _optimizer_state_entries(self.optimizer)
        views = self._moment_copies.views_for([local_tensor(state[key]) for state, key in entries])
        for (state, key), view in zip(entries, views):
            view.copy_(local_tensor(state[key]))
            state[key] = with_local(state[key], view)

    @contextmanager
    def in_use(self) -> Iterator[None]:
        """The model computes inside: its shard on the device (param_offload); back on the CPU after.

        On leaving, the memory either offload freed (the shard, the moments of the last optimizer
        step) goes back to the driver.
        """
        if not (self.params or self.optimizer_states):
            yield
            return
        if self._depth == 0 and self.params:
            self._params_to_device()
        self._depth += 1
        try:
            yield
        finally:
            self._depth -= 1
            if self._depth == 0:
                if self.params:
                    self._params_to_host()
                _release_cached_memory(self.device)

    @contextmanager
    def optimizer_step(self) -> Iterator[None]:
        """One optimizer step inside: Adam's moments on the device (optimizer_offload), on the CPU after.

        The first step creates the moments on the device; they move to the CPU after it like any other.
        """
        if self.released:
            raise RuntimeError("the optimizer's states were released at the end of training (release_optimizer); "
                               "a step now would start Adam's moments from zero")
        if not self.optimizer_states:
            yield
            return
        self._moments_to_device()
        try:
            yield
        finally:
            self._moments_to_host()

    def release_optimizer(self) -> None:
        """Training is over: Adam's moments and gradients go, wherever they are, and with them the host copies that
        held the moments (twice the fp32 shard, page-locked). The end-of-run export then gathers the full weights
        beside the shard's copy alone. A 7B actor offloaded on one H200 held 91-93 GiB of its 125 GiB host while it
        trained; the export's 28.4 GiB of full fp32 weights on top crosses the 95% at which Ray stops a worker, the
        likely end of the first such launch (2026-11-28, its log lost)."""
        self.released = True
        if self.optimizer is None:
            return
        self.optimizer.zero_grad(set_to_none=True)
        page_lock = self._moment_copies.page_lock
        if page_lock:
            torch.cuda.synchronize()  # no copy may still read the block when it goes
        self.optimizer.state.clear()
        self._moment_copies = Mirror(page_lock=page_lock)  # the block is freed with its last view
        gc.collect()
        _release_cached_memory(self.device)

    @contextmanager
    def everything_on_device(self) -> Iterator[None]:
        """Shard and optimizer states on the device (checkpoint save and load), offloaded again after.

        Loading an optimizer checkpoint puts its states beside the parameters: on the device here,
        then on the CPU again if optimizer_offload says so.
        """
        with self.in_use():
            outermost = self._checkpoint_depth == 0
            if outermost and self.optimizer_states:
                self._moments_to_device()
            self._checkpoint_depth += 1
            try:
                yield
            finally:
                self._checkpoint_depth -= 1
                if outermost and self.optimizer_states:
                    self._moments_to_host()


def _is_parameter(tensor: torch.Tensor) -> bool:
    return isinstance(tensor, nn.Parameter) or isinstance(tensor._base, nn.Parameter)


@contextmanager
def offload_activations(device: torch.device) -> Iterator[None]:
    """Tensors that autograd saves for backward inside the block wait in CPU memory until backward.

    Parameters (and views of them: a linear layer saves its weight transposed) are left alone:
    FSDP2 gathers the weights again for backward, and copying them would move the whole model
    across PCIe for every micro batch. On CUDA the copies go to pinned memory, asynchronously on
    the current stream (whose order keeps them safe), and tensors already on the CPU stay as they
    are; on a CPU run each copy is a plain clone, so the hooks' whole path runs.
    """
    pin = device.type == "cuda"

    def pack(tensor: torch.Tensor) -> Any:
        if _is_parameter(tensor) or (pin and tensor.device.type == "cpu"):
            return tensor
        host = torch.empty(tensor.size(), dtype=tensor.dtype, layout=tensor.layout, pin_memory=pin)
        host.copy_(tensor, non_blocking=pin)
        return tensor.device, host

    def unpack(packed: Any) -> torch.Tensor:
        if isinstance(packed, torch.Tensor):
            return packed
        where, host = packed
        return host.to(where, non_blocking=pin)

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        yield


def activation_offload(enabled: bool, device: torch.device) -> Any:
    """`offload_activations(device)` when the plan enables it, else a context that does nothing."""
    return offload_activations(device) if enabled else nullcontext()
