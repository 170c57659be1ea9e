"""model.compile_layers: torch.compile each decoder layer's forward (torchtitan's per-block compile).

Why per layer and not the whole model: every decoder layer runs the same code, so inductor compiles
one graph (forward and backward) that all layers share; the embedding, the loss head and the FSDP
hooks stay eager. What it buys is fusion of the elementwise work between the matmuls (RMSNorm,
rotary embedding, SwiGLU, residual adds, casts), which in eager mode is one kernel each and one
round trip through GPU memory each.

Only the layer's `forward` is replaced, on the instance: the module keeps its class, its parameter
names (state dicts, weight sync and checkpoints see no `_orig_mod.` prefix), and FSDP2's hooks and
gradient checkpointing keep running around it in eager mode.

Shapes: packed micro batches change length every call and padded ones change rows and width, so
the graphs must not be specialized to those sizes, but the model's own sizes must be.
- `dynamic=True` (before): under FSDP2 it also made the attention's head dim (an int attribute of
  the wrapped module) a run-time input, and inductor's rotary-embedding kernels then computed each
  element's address with 64-bit divisions by it, 6-9x slower than with constants (H100, 1.5B,
  15k-token rows: 288 and 178 us a call backward and forward, against 33 and 30 us for the same
  layer compiled outside FSDP; 39 ms of a 0.93 s update).
- Automatic dynamic shapes (`dynamic=None`) alone: one recompile per size that changes (rows,
  width, a single row), four graphs per grad mode on the padded path (measured on CPU), and the
  recompile limit of 8 reached with the log-prob passes.
- So: `dynamic=None`, which keeps ints and unmarked sizes constant, and every call marks the sizes
  that vary as dynamic (`torch._dynamo.maybe_mark_dynamic`): each dim of each tensor argument,
  except the last dim of the hidden states and of the rotary cos/sin (the hidden size, the head
  dim).
- The longest sequence of a packed micro batch is an int keyword argument (`max_length_q` /
  `max_length_k`, engine.workers.sequence.packing) that the CUDA varlen kernel reads. Left to
  automatic dynamic shapes it was a constant of the first graph, and its first new value recompiled
  the layer once (measured on an H200: tests/engine/test_compile_layers.py; the likely cause of the
  7B plans' second step taking 3-5 s more, 2026-11-28, docs/benchmarks.md). It is marked dynamic
  from the first compile (torch.compiler.config's `dynamic_sources`, set only around the layers'
  calls). On an H200 the GPU test then compiles no graph after the first batch (2026-11-28 late), and
  the 7B launches' step-2 π_old pass went from 4.0-4.1 s to 2.0-2.6 s (0.4-0.5 s in later steps).
- The rest of step 2's π_old pass was the module's mode, which dynamo guards on: the update left the
  model in training mode, so the next no-grad pass compiled its graphs again; ppo_update now puts it
  back in eval (tests/engine/test_compile_layers.py, through the trainer on CPU; not yet on a GPU).
- With checkpointing on, transformers makes the embedding's output require grad even without
  gradients (enable_input_require_grads), so in a no-grad pass the first layer's input differed from
  the others' and compiled a graph of its own: the flag is dropped there (it means nothing without
  gradients). So: one graph per grad mode.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from torch import nn


def compile_decoder_layers(layers: list[nn.Module], backend: str | Callable[..., Any] = "inductor") -> int:
    """Replace each layer's forward by its compiled version, in place; returns how many were compiled.

    Call before FSDP wraps the layers and after anything that swaps their submodules (Liger, LoRA),
    so the compiled code sees the modules it will run. Compilation happens at the first call.
    `backend`: torch.compile's (tests pass one that records the graphs it is given).
    """
    for layer in layers:
        if not is_compiled(layer):
            layer.forward = _marking_varying_sizes(torch.compile(layer.forward, backend=backend))
    return len(layers)


# The int keyword arguments that vary from micro batch to micro batch (the varlen kernels' longest sequence), as
# dynamo names their sources in a decoder layer's forward(hidden_states, ..., **kwargs); exact names, which every
# torch with the setting reads (later ones also take regular expressions).
DYNAMIC_INTS = "L['kwargs']['max_length_q'],L['kwargs']['max_length_k']"


def _dynamic_ints() -> Any:
    """A context that has dynamo trace DYNAMIC_INTS as symbolic ints (torch.compiler.config.dynamic_sources); a
    no-op on a torch without that setting (the int then costs one recompile when it first changes)."""
    config = torch.compiler.config
    if "dynamic_sources" not in getattr(config, "_config", {}):
        return contextlib.nullcontext()
    return config.patch(dynamic_sources=DYNAMIC_INTS)


def _marking_varying_sizes(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """`compiled`, called with its arguments' varying sizes marked dynamic (see the module doc)."""

    def forward(*args: Any, **kwargs: Any) -> Any:
        hidden_states = args[0] if args else kwargs.get("hidden_states")
        if not torch.is_grad_enabled() and isinstance(hidden_states, torch.Tensor) and hidden_states.requires_grad:
            # With checkpointing on, transformers makes the embedding's output require grad even in a no-grad pass
            # (enable_input_require_grads), so the first layer's input differed from the others' and compiled a
            # graph of its own; without gradients the flag means nothing.
            hidden_states = hidden_states.detach()
            if args:
                args = (hidden_states, *args[1:])
            else:
                kwargs["hidden_states"] = hidden_states
        widths = {id(t) for t in (hidden_states, *(kwargs.get("position_embeddings") or ()))}
        for value in (*args, *kwargs.values()):
            for tensor in value if isinstance(value, tuple | list) else (value,):
                if isinstance(tensor, torch.Tensor):
                    for dim in range(tensor.dim() - (id(tensor) in widths)):
                        torch._dynamo.maybe_mark_dynamic(tensor, dim)
        with _dynamic_ints():
            return compiled(*args, **kwargs)

    forward._torchdynamo_orig_callable = compiled._torchdynamo_orig_callable  # type: ignore[attr-defined]
    return forward


def is_compiled(layer: nn.Module) -> bool:
    """Whether `layer.forward` is a compiled function (set by compile_decoder_layers)."""
    return hasattr(layer.__dict__.get("forward"), "_torchdynamo_orig_callable")
