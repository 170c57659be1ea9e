"""Log-probs (and entropy) of response tokens under a causal LM, for left-padded prompt+response rows.

Row layout: [prompt (left-padded to P) | response (right-padded to R)]. The logit that predicts
response token t sits at column P + t - 1, hence the slice [P-1 : P+R-1].
"""

from __future__ import annotations

import torch
from torch import nn

from engine.algos.losses import entropy_from_logits, entropy_from_logits_chunked, log_probs_from_logits
from engine.workers.batch import TensorBatch


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    # Left padding: real tokens must start at position 0, as they did during generation.
    return (attention_mask.cumsum(-1) - 1).clamp_min(0)


def response_log_probs(model: nn.Module, batch: TensorBatch, temperature: float,
                       with_entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """([b, R] log-probs of `responses`, [b, R] entropy or None); differentiable."""
    responses = batch["responses"]
    response_length = responses.shape[1]
    prompt_length = batch["input_ids"].shape[1] - response_length
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                position_ids=batch["position_ids"], use_cache=False)
    logits = out.logits[:, prompt_length - 1:-1].float()
    # Sampling divided the logits by the temperature; the policy being optimized is that one.
    logits = logits / max(temperature, 1e-6)
    log_probs = log_probs_from_logits(logits, responses)
    entropy = None
    if with_entropy:
        # Without autograd, chunks keep the softmax temporary at [chunk, V] instead of [b, R, V].
        entropy = entropy_from_logits(logits) if torch.is_grad_enabled() else entropy_from_logits_chunked(logits)
    return log_probs, entropy
