"""The loss head's log-prob and entropy math in two Triton kernels: what fused_kernel_options.impl_backend=triton
and, on CUDA, actor.use_torch_compile run (rlconf/loss_head.py).

For logits [N, V] (any float dtype, rows contiguous), labels [N] and a temperature, with z = logits / T:

- forward, one program per row, one pass over the row: the online log-sum-exp (a running max and
  the sum of exp(z - max), per lane, rescaled when the max grows) together with the sum of
  exp(z - max) × z, so lse = logsumexp(z), log p(label) = z[label] - lse and the entropy
  H = lse - Σ p z come out of one read of the logits. Nothing vocab-wide is written.
- backward, one pass: p = exp(z - lse) recomputed per element and
  d/dz = g_lp (onehot(label) - p) + g_H p (Σ p z - z)   (Σ p z = lse - H; engine.workers.sequence.fused_head
  derives the same gradients), written once in the logits' dtype, ÷ T.

So the head keeps only what it is given (the logits, saved for backward) and four bytes per row;
the eager torch head keeps fp32 [N, V] tensors, and torch.compile's head (which rlconf ran for use_torch_compile
until c944803) read the logits several times (bench/profile_update.py). Used on the kept logits by engine.workers.passes.logprob, and on each chunk of
the fused head (use_fused_kernels) by engine.workers.sequence.fused_head. CUDA only: Triton is a GPU compiler
(`rlconf launch` refuses impl_backend triton on CPU, and RL528 warns at validation; use_torch_compile runs the
eager head there); the kernels are checked against the fp32 reference on a GPU (tests/engine/test_triton_head.py),
and through the engine's passes against the eager head (tests/engine/test_kernels_gpu.py).
"""

from __future__ import annotations

import torch

# Elements of a row each program step holds per lane vector. 2048 × 3 fp32 vectors over 8 warps is
# 24 registers a thread for the forward's state; the backward holds one vector.
FORWARD_BLOCK, BACKWARD_BLOCK, WARPS = 2048, 4096, 8


try:  # CUDA builds of torch ship Triton; CPU builds do not
    import triton
    import triton.language as tl
except ImportError:
    triton = None


def triton_available() -> bool:
    """Whether Triton imports here (the kernels are defined only then)."""
    return triton is not None


if triton is not None:
    @triton.jit
    def _forward_kernel(logits_ptr, row_stride, labels_ptr, lse_ptr, log_prob_ptr, entropy_ptr, vocab,
                       inv_temperature, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * row_stride
        cols = tl.arange(0, BLOCK)
        run_max = tl.full([BLOCK], float("-inf"), tl.float32)
        run_sum = tl.zeros([BLOCK], tl.float32)  # Σ exp(z - run_max), per lane
        run_dot = tl.zeros([BLOCK], tl.float32)  # Σ exp(z - run_max) × z, per lane
        for start in tl.range(0, vocab, BLOCK):
            idx = start + cols
            z = tl.load(base + idx, mask=idx < vocab, other=float("-inf")).to(tl.float32) * inv_temperature
            new_max = tl.maximum(run_max, z)
            # A lane that has seen only -inf keeps max -inf, where exp(-inf - -inf) would be nan.
            seen = new_max > float("-inf")
            rescale = tl.where(seen, tl.exp(run_max - new_max), 0.0)
            weight = tl.where(seen, tl.exp(z - new_max), 0.0)
            run_sum = run_sum * rescale + weight
            run_dot = run_dot * rescale + tl.where(weight > 0.0, weight * z, 0.0)
            run_max = new_max
        row_max = tl.max(run_max, 0)
        lane_weight = tl.where(run_max > float("-inf"), tl.exp(run_max - row_max), 0.0)
        total = tl.sum(run_sum * lane_weight, 0)
        lse = row_max + tl.log(total)
        label = tl.load(labels_ptr + row)
        z_label = tl.load(base + label).to(tl.float32) * inv_temperature
        tl.store(lse_ptr + row, lse)
        tl.store(log_prob_ptr + row, z_label - lse)
        tl.store(entropy_ptr + row, lse - tl.sum(run_dot * lane_weight, 0) / total)

    @triton.jit
    def _backward_kernel(logits_ptr, row_stride, grad_ptr, grad_row_stride, labels_ptr, lse_ptr, entropy_ptr,
                        grad_log_prob_ptr, grad_entropy_ptr, vocab, inv_temperature,
                        LOG_PROB_GRAD: tl.constexpr, ENTROPY_GRAD: tl.constexpr, BLOCK: tl.constexpr):
        row = tl.program_id(0).to(tl.int64)
        base = logits_ptr + row * row_stride
        grad_base = grad_ptr + row * grad_row_stride
        cols = tl.arange(0, BLOCK)
        lse = tl.load(lse_ptr + row)
        mean_z = lse - tl.load(entropy_ptr + row)  # Σ p z
        label = tl.load(labels_ptr + row)
        g_lp = 0.0
        g_h = 0.0
        if LOG_PROB_GRAD:
            g_lp = tl.load(grad_log_prob_ptr + row)
        if ENTROPY_GRAD:
            g_h = tl.load(grad_entropy_ptr + row)
        for start in tl.range(0, vocab, BLOCK):
            idx = start + cols
            valid = idx < vocab
            z = tl.load(base + idx, mask=valid, other=0.0).to(tl.float32) * inv_temperature
            p = tl.exp(z - lse)
            # A logit of -inf has p = 0 and (mean_z - z) = inf: its entropy term is 0 (as eager's), not 0 × inf.
            entropy_term = tl.where(p > 0.0, g_h * (mean_z - z), 0.0)
            grad_z = p * (entropy_term - g_lp) + tl.where(idx == label, g_lp, 0.0)
            tl.store(grad_base + idx, (grad_z * inv_temperature).to(grad_ptr.dtype.element_ty), mask=valid)


def _rows(logits: torch.Tensor) -> torch.Tensor:
    return logits if logits.stride(-1) == 1 else logits.contiguous()


def logit_terms_forward(logits: torch.Tensor, labels: torch.Tensor, temperature: float
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[N, V] logits, [N] labels -> fp32 ([N] lse, [N] log-probs of the labels, [N] entropy) of z = logits / T."""
    logits, n = _rows(logits), logits.shape[0]
    lse, log_probs, entropy = (torch.empty(n, device=logits.device, dtype=torch.float32) for _ in range(3))
    if n:
        _forward_kernel[(n,)](logits, logits.stride(0), labels.contiguous(), lse, log_probs, entropy, logits.shape[1],
                             1.0 / temperature, BLOCK=FORWARD_BLOCK, num_warps=WARPS)
    return lse, log_probs, entropy


def logit_terms_backward(logits: torch.Tensor, labels: torch.Tensor, lse: torch.Tensor, entropy: torch.Tensor,
                         grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None,
                         temperature: float) -> torch.Tensor:
    """The gradient [N, V] (the logits' dtype) of Σ g_lp · log p(label) + Σ g_H · H with respect to the logits."""
    logits = _rows(logits)
    grad = torch.empty_like(logits, memory_format=torch.contiguous_format)
    if logits.shape[0]:
        _backward_kernel[(logits.shape[0],)](
            logits, logits.stride(0), grad, grad.stride(0), labels.contiguous(), lse, entropy,
            grad_log_probs.contiguous() if grad_log_probs is not None else lse,
            grad_entropy.contiguous() if grad_entropy is not None else lse, logits.shape[1], 1.0 / temperature,
            LOG_PROB_GRAD=grad_log_probs is not None, ENTROPY_GRAD=grad_entropy is not None,
            BLOCK=BACKWARD_BLOCK, num_warps=WARPS)
    return grad


class TritonLogitTerms(torch.autograd.Function):
    """(logits [N, V], labels [N], temperature) -> ([N] fp32 log-probs, [N] fp32 entropy)."""

    @staticmethod
    def forward(ctx, logits: torch.Tensor, labels: torch.Tensor, temperature: float
                ) -> tuple[torch.Tensor, torch.Tensor]:
        lse, log_probs, entropy = logit_terms_forward(logits, labels, temperature)
        ctx.save_for_backward(logits, labels, lse, entropy)
        ctx.temperature = temperature
        ctx.set_materialize_grads(False)  # an output nobody used gets no zero-filled gradient
        return log_probs, entropy

    @staticmethod
    def backward(ctx, grad_log_probs: torch.Tensor | None, grad_entropy: torch.Tensor | None):
        logits, labels, lse, entropy = ctx.saved_tensors
        if grad_log_probs is None and grad_entropy is None:
            return None, None, None
        return logit_terms_backward(logits, labels, lse, entropy, grad_log_probs, grad_entropy, ctx.temperature), None, None


def triton_token_log_probs(logits: torch.Tensor, labels: torch.Tensor, temperature: float
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """As logprob._logit_terms (fp32 log-probs and entropy of softmax(logits / T)), through the kernels."""
    return TritonLogitTerms.apply(logits, labels, temperature)
