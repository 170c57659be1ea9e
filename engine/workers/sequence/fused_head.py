"""use_fused_kernels: log-probs and entropy straight from the last hidden states and the lm_head
weight, never holding the [N, V] logits of the whole micro batch (pure torch, so it runs on CPU too).

`FusedLinearLogProbs` walks the N response positions in chunks of FUSED_CHUNK_TOKENS rows. Per
chunk: logits = h @ Wᵀ in the weight's dtype, then temperature, log-softmax and entropy in fp32
(float64 stays float64).
Forward saves h, W, the labels and per row the fp32 logsumexp and entropy (8 B per token: nothing
vocab-wide); backward recomputes each chunk's logits and turns them into that chunk's rows of
grad_h and its contribution to grad_W (accumulated in fp32 over chunks, cast to W's dtype once).

Gradients, with z = logits / T, p = softmax(z), lse = logsumexp(z), H = entropy:
  d log p_label / dz = onehot(label) - p
  d H / dz_j         = -p_j (z_j - lse + H)          (H = -Σ p log p, log p = z - lse)
and dz / dlogits = 1 / T.

`fused_lm_head` swaps the HF model's head for one that runs the Function on the response positions
and returns (log-prob, entropy) pairs where logits would be, so the engine's padded / packed slicing
of "logits" picks those pairs. Running inside the head's call matters under FSDP2: the head weight
is gathered only while its module runs (and again in its backward).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from rlconf.estimate import FUSED_LOGIT_CHUNK_TOKENS

# Rows per chunk (why 1024: rlconf/estimate.py, which counts the chunk's bytes).
FUSED_CHUNK_TOKENS = FUSED_LOGIT_CHUNK_TOKENS


def _math_dtype(logits: torch.Tensor) -> torch.Tensor:
    """fp32 for bf16 / fp16 / fp32 logits; float64 stays float64 (so gradcheck can check the math)."""
    return logits.to(torch.promote_types(logits.dtype, torch.float32))


def _chunk_terms(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 (lse, log-prob of label, entropy) of one chunk; logits in the weight's dtype."""
    z = _math_dtype(h.to(weight.dtype) @ weight.t()) / temperature
    lse = torch.logsumexp(z, dim=-1)
    log_probs = z.gather(-1, labels[:, None]).squeeze(-1) - lse
    entropy = lse - (torch.softmax(z, dim=-1) * z).sum(-1)
    return lse, log_probs, entropy


class FusedLinearLogProbs(torch.autograd.Function):
    """(hidden [N, H], weight [V, H], labels [N]) -> ([N] fp32 log-probs, [N] fp32 entropy)."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float,
                chunk_size: int, use_triton: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        n, math_dtype = hidden.shape[0], torch.promote_types(weight.dtype, torch.float32)
        log_probs = hidden.new_empty(n, dtype=math_dtype)
        entropy = hidden.new_empty(n, dtype=math_dtype)
        lse = hidden.new_empty(n, dtype=math_dtype)
        for start in range(0, n, chunk_size):
            rows = slice(start, start + chunk_size)
            if use_triton:
                from engine.workers.sequence.triton_head import logit_terms_forward

                logits = hidden[rows].to(weight.dtype) @ weight.t()
                lse[rows], log_probs[rows], entropy[rows] = logit_terms_forward(logits, labels[rows], temperature)
            else:
                lse[rows], log_probs[rows], entropy[rows] = _chunk_terms(hidden[rows], weight, labels[rows], temperature)
        ctx.save_for_backward(hidden, weight, labels, lse, entropy)
        ctx.temperature, ctx.chunk_size, ctx.use_triton = temperature, chunk_size, use_triton
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor, grad_entropy: torch.Tensor):
        hidden, weight, labels, lse, entropy = ctx.saved_tensors
        temperature, chunk_size = ctx.temperature, ctx.chunk_size
        need_h, need_w = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        grad_hidden = torch.zeros_like(hidden) if need_h else None
        grad_weight = torch.zeros(weight.shape, dtype=lse.dtype, device=weight.device) if need_w else None
        for start in range(0, hidden.shape[0], chunk_size):
            rows = slice(start, start + chunk_size)
            h = hidden[rows].to(weight.dtype)
            if ctx.use_triton:
                from engine.workers.sequence.triton_head import logit_terms_backward

                # The chunk's logits and their gradient, both in the weight's dtype (2 + 2 B per row × vocab).
                grad_logits = logit_terms_backward(h @ weight.t(), labels[rows], lse[rows], entropy[rows],
                                                   grad_log_probs[rows], grad_entropy[rows], temperature)
            else:
                grad_logits = _chunk_logit_grad(h, weight, labels[rows], lse[rows], entropy[rows],
                                                grad_log_probs[rows], grad_entropy[rows], temperature)
            if need_h:
                grad_hidden[rows] = (grad_logits @ weight).to(hidden.dtype)
            if need_w:
                grad_weight += (grad_logits.t() @ h).to(grad_weight.dtype)
        return (grad_hidden, grad_weight.to(weight.dtype) if need_w else None, None, None, None, None)


def _chunk_logit_grad(h: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor,
                      entropy: torch.Tensor, grad_log_probs: torch.Tensor, grad_entropy: torch.Tensor,
                      temperature: float) -> torch.Tensor:
    """One chunk's gradient with respect to its logits h @ Wᵀ, in the weight's dtype."""
    # In place where possible: at most three fp32 chunk-sized tensors live at once
    # (12 B per chunk row × vocab; rlconf/estimate.py loss_head_bytes).
    log_p = _math_dtype(h @ weight.t()) / temperature
    log_p -= lse[:, None]
    p = log_p.exp()
    # grad of H through z (see module doc), then of the label's log-prob.
    grad_z = log_p.add_(entropy[:, None]).mul_(p).mul_(-grad_entropy[:, None])
    grad_z -= p * grad_log_probs[:, None]
    del p
    grad_z.scatter_add_(-1, labels[:, None], grad_log_probs[:, None])
    return grad_z.div_(temperature).to(weight.dtype)


def fused_token_log_probs(hidden: torch.Tensor, weight: torch.Tensor, labels: torch.Tensor, temperature: float,
                          with_entropy: bool, chunk_size: int = FUSED_CHUNK_TOKENS, use_triton: bool = False
                          ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """As logprob.token_log_probs on logits = hidden @ weightᵀ, without those [N, V] logits.

    `use_triton` (fused_kernel_options.impl_backend=triton): each chunk's math in
    engine.workers.sequence.triton_head's kernels, which hold only the chunk's logits and their gradient in the
    weight's dtype instead of three fp32 chunk-sized tensors."""
    temperature = max(temperature, 1e-6)  # the same floor as the plain path
    log_probs, entropy = FusedLinearLogProbs.apply(hidden, weight, labels, temperature, chunk_size, use_triton)
    return log_probs, (entropy if with_entropy else None)


@contextmanager
def fused_lm_head(model: nn.Module, next_tokens: torch.Tensor, keep: torch.Tensor, temperature: float,
                  use_triton: bool = False) -> Iterator[None]:
    """While open, the model's output head returns [b, T, 2] fp32 "logits": (log-prob of the next
    token, entropy) at the `keep` positions ([b, T] bool; `next_tokens` [b, T] are their labels), 0
    elsewhere. The Function runs inside the head's own call, so under FSDP2 it sees the gathered weight
    in forward and backward, exactly as the plain head's matmul would."""
    head = model.get_output_embeddings()
    # A plain bias-free Linear (FSDP2's subclass of it included): a LoRA-wrapped head's `weight` would
    # leave its adapter out, silently.
    if not isinstance(head, nn.Linear) or head.bias is not None:
        raise ValueError(f"use_fused_kernels needs a bias-free nn.Linear output head; {type(model).__name__} has "
                         f"{type(head).__name__}{' with a bias' if getattr(head, 'bias', None) is not None else ''}: "
                         f"set use_fused_kernels: false")

    def log_probs_out(hidden_states: torch.Tensor) -> torch.Tensor:
        if hidden_states.shape[:2] != keep.shape:
            raise ValueError(f"use_fused_kernels: the head saw {tuple(hidden_states.shape[:2])} positions, expected "
                             f"{tuple(keep.shape)} (sequence-parallel slices are not supported with fused kernels)")
        log_probs, entropy = fused_token_log_probs(hidden_states[keep], head.weight, next_tokens[keep], temperature,
                                                   with_entropy=True, use_triton=use_triton)
        out = log_probs.new_zeros((*keep.shape, 2))
        out[keep] = torch.stack([log_probs, entropy], dim=-1)
        return out

    head.forward = log_probs_out  # an instance attribute: nn.Module.__call__ (and FSDP's hooks) still run
    try:
        yield
    finally:
        del head.forward
