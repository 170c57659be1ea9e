"""flash-attn-4's CuTe kernels as the packed rows' attention, where installed (optional, CUDA SM90+).

On an H100, at the 1.5B shape's heads (12 query, 2 key/value, head dim 128) and bench/train_knobs.py's
length spread, one layer's causal varlen attention, forward + backward on a 15,088-token packed row,
takes 0.73-0.77 ms with flash-attn-4 against 0.93-0.99 ms with the FlashAttention-2 kernels built into
torch (`python bench/attention_kernels.py`, docs/benchmarks.md). engine.workers.sequence.packing calls it in
place of torch's kernel when `fa4_available()`.

The kernels are wrapped as two torch.library custom ops (forward, backward) so that torch.compile
(model.compile_layers) keeps each decoder layer one graph: it sees an opaque call with known output
shapes instead of tracing into CuTe's JIT. They call flash-attn-4's `_flash_attn_fwd` / `_flash_attn_bwd`
(what its own autograd function calls); `fa4_available` checks that these take the arguments used
here, so a flash-attn-4 that renamed them is not used, and torch's kernel stays.
"""

from __future__ import annotations

import inspect
from functools import cache

import torch

# What this module passes to flash-attn-4's private functions; checked before they are trusted.
_FORWARD_ARGS = {"cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "softmax_scale", "causal", "return_lse"}
_BACKWARD_ARGS = {"cu_seqlens_q", "cu_seqlens_k", "max_seqlen_q", "max_seqlen_k", "softmax_scale", "causal"}


@cache
def fa4_available() -> bool:
    """Whether flash-attn-4 imports, takes the calls below, and runs on this machine's GPU (SM90 or newer)."""
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9:
        return False
    try:
        from flash_attn.cute import interface
    except Exception:  # not installed, or its CUDA DSL does not load here
        return False
    forward, backward = getattr(interface, "_flash_attn_fwd", None), getattr(interface, "_flash_attn_bwd", None)
    return (forward is not None and backward is not None
            and _FORWARD_ARGS <= set(inspect.signature(forward).parameters)
            and _BACKWARD_ARGS <= set(inspect.signature(backward).parameters))


@torch.library.custom_op("rlconf::fa4_varlen_forward", mutates_args=())
def fa4_varlen_forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                       max_seqlen: int, scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal attention within each sequence: q [T, Hq, D], k/v [T, Hkv, D] -> (out [T, Hq, D], lse [Hq, T] fp32)."""
    from flash_attn.cute.interface import _flash_attn_fwd

    out, lse, *_ = _flash_attn_fwd(q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens, max_seqlen_q=max_seqlen,
                                   max_seqlen_k=max_seqlen, softmax_scale=scale, causal=True, return_lse=True)
    return out, lse


@fa4_varlen_forward.register_fake
def _forward_shapes(q, k, v, cu_seqlens, max_seqlen, scale):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


@torch.library.custom_op("rlconf::fa4_varlen_backward", mutates_args=())
def fa4_varlen_backward(grad_out: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor,
                        lse: torch.Tensor, cu_seqlens: torch.Tensor, max_seqlen: int, scale: float
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from flash_attn.cute.interface import _flash_attn_bwd

    dq, dk, dv = _flash_attn_bwd(q, k, v, out, grad_out, lse, softmax_scale=scale, causal=True,
                                 cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                                 max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen)[:3]
    return dq, dk, dv


@fa4_varlen_backward.register_fake
def _backward_shapes(grad_out, q, k, v, out, lse, cu_seqlens, max_seqlen, scale):
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


def _save(ctx, inputs, output) -> None:
    q, k, v, cu_seqlens, max_seqlen, scale = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens)
    ctx.max_seqlen, ctx.scale = max_seqlen, scale


def _backward(ctx, grad_out, _grad_lse):
    q, k, v, out, lse, cu_seqlens = ctx.saved_tensors
    dq, dk, dv = fa4_varlen_backward(grad_out, q, k, v, out, lse, cu_seqlens, ctx.max_seqlen, ctx.scale)
    return dq, dk, dv, None, None, None


fa4_varlen_forward.register_autograd(_backward, setup_context=_save)


def fa4_varlen_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, cu_seqlens: torch.Tensor,
                    max_seqlen: int, scaling: float | None) -> torch.Tensor:
    """engine.workers.sequence.packing.flash_varlen_call's contract by flash-attn-4: q [T, Hq, D], k/v [T, Hkv, D] -> [T, Hq, D]."""
    scale = scaling if scaling is not None else q.shape[-1] ** -0.5
    return fa4_varlen_forward(q, k, v, cu_seqlens, max_seqlen, scale)[0]
