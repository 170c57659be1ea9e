"""Log-probs (and entropy) of response tokens under a causal LM, for left-padded prompt+response rows.

Row layout: [prompt (left-padded to P) | response (right-padded to R)]. The logit that predicts
response token t sits at column P + t - 1, hence the slice [P-1 : P+R-1]. With packing
(use_remove_padding, engine.workers.sequence.packing) the same logits are picked out of one packed row.

The logit math (temperature, log-softmax at the sampled token, entropy) runs in fp32 on [N, V]
logits, N = the positions kept. How much of it lives at once (`LogitOptions`):

- default: one fp32 pass over all N rows; under autograd its fp32 [N, V] temporaries are kept for
  backward, as in a plain implementation.
- entropy_from_logits_with_chunking: chunks of `chunk_size` rows, each chunk recomputed in
  backward (torch.utils.checkpoint), so no fp32 [N, V] tensor is kept: one chunk's at a time.
- entropy_checkpointing: the same chunked recompute (a single recomputed chunk of all N rows would
  materialize the same fp32 [N, V] temporaries in backward and save nothing: measured on an H100).

Without autograd (old / reference log-probs), the eager head always chunks: nothing needs keeping.
Only the model's own [N, V] logits in the compute dtype are kept for backward in every mode.
use_fused_kernels (`fused`) skips even those: engine.workers.sequence.fused_head computes log-probs and
entropy chunk by chunk from the last hidden states and the head weight.
`triton` (rlconf.loss_head: fused_kernel_options.impl_backend=triton, or actor.use_torch_compile on CUDA):
engine.workers.sequence.triton_head's kernels do the math in one pass over the logits each way, keeping
nothing fp32 vocab-wide (with or without `fused`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from engine.batch import TensorBatch
from engine.workers.sequence.fused_head import fused_lm_head
from engine.workers.sequence.packing import head_keeps_positions, pack_rows, packed_forward
from engine.workers.sequence.ulysses import sequence_parallel_of, sequence_parallel_outputs
from rlconf.estimate import LOGIT_CHUNK_TOKENS


@dataclass(frozen=True)
class LogitOptions:
    """How the forward runs: packed rows (use_remove_padding), chunked / recomputed fp32 logit math."""

    packed: bool = False
    entropy_chunking: bool = False
    entropy_checkpointing: bool = False
    chunk_size: int = LOGIT_CHUNK_TOKENS
    fused: bool = False  # use_fused_kernels: log-probs from hidden states and head weight (engine.workers.sequence.fused_head)
    # The logit math in engine.workers.sequence.triton_head's kernels (rlconf.loss_head: impl_backend=triton, or
    # use_torch_compile on CUDA), which keep no fp32 [N, V] tensor (nothing to chunk), here and in the fused head.
    triton: bool = False


def _logit_terms(logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 (log-prob of `labels`, entropy) of softmax(logits / temperature), [n, V] -> [n], [n]."""
    # Sampling divided the logits by the temperature; the policy being optimized is that one.
    z = logits.float() / temperature
    normalizer = torch.logsumexp(z, dim=-1)
    log_probs = z.gather(-1, labels[:, None]).squeeze(-1) - normalizer
    if not with_entropy:
        return log_probs, log_probs.new_zeros(())
    return log_probs, normalizer - (torch.softmax(z, dim=-1) * z).sum(-1)


def token_log_probs(logits: torch.Tensor, labels: torch.Tensor, temperature: float, with_entropy: bool,
                    options: LogitOptions = LogitOptions()) -> tuple[torch.Tensor, torch.Tensor | None]:
    """[N, V] logits (any dtype), [N] labels -> ([N] fp32 log-probs, [N] fp32 entropy or None)."""
    temperature = max(temperature, 1e-6)
    if options.triton:
        from engine.workers.sequence.triton_head import triton_token_log_probs

        log_probs, entropy = triton_token_log_probs(logits, labels, temperature)
        return log_probs, (entropy if with_entropy else None)
    grad = torch.is_grad_enabled() and logits.requires_grad
    chunked = options.entropy_chunking or options.entropy_checkpointing or not grad
    recompute = grad and (options.entropy_chunking or options.entropy_checkpointing)
    size = options.chunk_size if chunked else max(logits.shape[0], 1)
    log_probs, entropy = [], []
    for logit_chunk, label_chunk in zip(logits.split(size), labels.split(size), strict=True):
        if recompute:
            lp, ent = checkpoint(_logit_terms, logit_chunk, label_chunk, temperature, with_entropy, use_reentrant=False)
        else:
            lp, ent = _logit_terms(logit_chunk, label_chunk, temperature, with_entropy)
        log_probs.append(lp)
        entropy.append(ent)
    if not log_probs:
        empty = logits.new_zeros((0,), dtype=torch.float32)
        return empty, (empty if with_entropy else None)
    return torch.cat(log_probs), (torch.cat(entropy) if with_entropy else None)


def response_logits(model: nn.Module, batch: TensorBatch, options: LogitOptions
                    ) -> tuple[torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """The model's outputs [N, ...] at the N positions that predict response tokens, and how to put
    [N, ...] values back into the [b, R, ...] response layout (0 where nothing was computed).

    Padded: N = b × R (every response column, padding included). Packed: N = real response tokens;
    with Ulysses (engine.workers.sequence.ulysses) only the ones in this rank's slice of the packed row, and
    the way back gathers the other sp ranks' values.
    """
    outputs, _labels, to_rows = _response_outputs(model, batch, options)
    return outputs, to_rows


def _response_outputs(model: nn.Module, batch: TensorBatch, options: LogitOptions
                      ) -> tuple[torch.Tensor, torch.Tensor, Callable[[torch.Tensor], torch.Tensor]]:
    """As `response_logits`, plus the response token each output predicts (its label)."""
    if options.packed:
        packed = pack_rows(batch)
        # By the packed indices, not the mask: a boolean mask's result size is a read-back (a sync).
        labels = batch["responses"][packed.response_rows, packed.response_cols]
        sp = sequence_parallel_of(model)
        if sp is not None:
            outputs, mine, to_rows = sequence_parallel_outputs(model, packed, sp)
            return outputs, labels[mine], to_rows
        # The fused head reads every position's hidden state itself (fused_lm_head's `keep`).
        positions = None if options.fused else packed.predict_index
        logits = packed_forward(model, packed, positions)
        return (logits if positions is not None else logits[packed.predict_index]), labels, packed.unpack
    rows, response_length = batch["responses"].shape
    prompt_length = batch["input_ids"].shape[1] - response_length
    # The last R + 1 positions hold the R that predict response tokens: the head skips the prompt's.
    keep = {} if options.fused or not head_keeps_positions(model) else {"logits_to_keep": response_length + 1}
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], use_cache=False, **keep)
    logits = out.logits[:, :response_length] if keep else out.logits[:, prompt_length - 1:-1]
    return logits.reshape(rows * response_length, *logits.shape[2:]), batch["responses"].reshape(-1), (
        lambda values: values.reshape(rows, response_length, *values.shape[1:]))


def _fused_targets(batch: TensorBatch, options: LogitOptions) -> tuple[torch.Tensor, torch.Tensor]:
    """([b, T] next token, [b, T] bool: predicts a response token) in the layout the model sees."""
    if options.packed:
        packed = pack_rows(batch)
        keep = torch.zeros_like(packed.input_ids, dtype=torch.bool)
        keep[0, packed.predict_index] = True
        return packed.input_ids.roll(-1, dims=1), keep
    input_ids = batch["input_ids"]
    prompt_length = input_ids.shape[1] - batch["responses"].shape[1]
    keep = torch.zeros_like(input_ids, dtype=torch.bool)
    keep[:, prompt_length - 1:-1] = True
    return input_ids.roll(-1, dims=1), keep


def response_log_probs(model: nn.Module, batch: TensorBatch, temperature: float, with_entropy: bool = False,
                       options: LogitOptions = LogitOptions(), entropy_metric: bool = False
                       ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([b, R] log-probs of `responses`, [b, R] entropy or None); differentiable.

    `entropy_metric` (without `with_entropy`): the entropy as well, outside autograd and in chunks,
    for a metric: it adds one chunk's fp32 math to the peak, nothing to what backward keeps.
    Packed, the padding columns hold 0; padded, they hold whatever the pad logits give. Either way
    every consumer masks them with response_mask.
    """
    if options.fused:
        # The head returns (log-prob, entropy) pairs, so the slicing below picks pairs, not logits.
        next_tokens, keep = _fused_targets(batch, options)
        with fused_lm_head(model, next_tokens, keep, temperature, options.triton):
            pairs, _labels, to_rows = _response_outputs(model, batch, options)
        log_probs = pairs[:, 0]
        # The fused head computes the entropy anyway; as a metric only it leaves autograd.
        entropy = pairs[:, 1] if with_entropy else (pairs[:, 1].detach() if entropy_metric else None)
    else:
        logits, labels, to_rows = _response_outputs(model, batch, options)
        # The Triton kernels compute the entropy in the same pass anyway: as a metric only, it leaves autograd.
        both = with_entropy or (entropy_metric and options.triton)
        log_probs, entropy = token_log_probs(logits, labels, temperature, both, options)
        if entropy is not None and not with_entropy:
            entropy = entropy.detach()
        if entropy is None and entropy_metric:
            with torch.no_grad():
                entropy = token_log_probs(logits.detach(), labels, temperature, True, options)[1]
    return to_rows(log_probs), (to_rows(entropy) if entropy is not None else None)


@torch.no_grad()
def response_log_probs_and_sum_pi_squared(model: nn.Module, batch: TensorBatch, temperature: float,
                                          options: LogitOptions = LogitOptions()
                                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """[b, R] (log-probs, entropy, Σ_v π(v)²) of one forward, for the optimal-token-baseline estimators.

    Σπ² is taken chunk by chunk (options.chunk_size rows) from the same logits at the sampling
    temperature, so no fp32 [N, V] tensor is kept.
    """
    from engine.algos.advantages import sum_pi_squared_from_logits

    logits, labels, to_rows = _response_outputs(model, batch, options)
    log_probs, entropy = token_log_probs(logits, labels, temperature, True, options)
    size = max(options.chunk_size, 1)
    squares = [sum_pi_squared_from_logits(chunk, temperature) for chunk in logits.split(size)]
    sum_pi_squared = torch.cat(squares) if squares else log_probs.new_zeros((0,))
    return to_rows(log_probs), to_rows(entropy), to_rows(sum_pi_squared)
