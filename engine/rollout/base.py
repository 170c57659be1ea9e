"""What a rollout backend does for the actor worker, and the rows every backend hands back.

A backend turns left-padded prompts into sampled responses with the plan's sampling, receives the
actor's new weights after each update, and can release its memory while the actor trains. The
actor worker holds one backend (engine.rollout.build_rollout picks it from rollout.name) and has no
rollout code of its own.

Rows come back as [prompt (left-padded to P) | response (right-padded to R)] with masks, the layout
engine.workers.passes.logprob reads; a backend that knows the sampling log-probs adds them as
`rollout_log_probs` ([b, R], 0 on padding) when the sampling asks for them (Sampling.log_probs).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from engine.batch import TensorBatch, masked_rows, position_ids_from_mask


@dataclass(frozen=True)
class Sampling:
    """How to sample one response per prompt row (the trainer already repeated each prompt n times)."""

    greedy: bool
    temperature: float
    top_p: float
    top_k: int  # <= 0: off
    ignore_eos: bool
    max_new_tokens: int
    log_probs: bool = True  # return each sampled token's log-prob as `rollout_log_probs`

    @classmethod
    def from_plan(cls, sampling: Any, ignore_eos: bool, max_new_tokens: int, *, log_probs: bool) -> Sampling:
        """`sampling`: rollout or rollout.val_kwargs (both have do_sample, temperature, top_p, top_k); `log_probs`:
        the plan's roles.rollout.log_probs for training rollouts (validation's are never read)."""
        greedy = not (sampling.do_sample and sampling.temperature > 0)
        return cls(greedy=greedy, temperature=1.0 if greedy else sampling.temperature, top_p=sampling.top_p,
                   top_k=sampling.top_k, ignore_eos=ignore_eos, max_new_tokens=max_new_tokens, log_probs=log_probs)


class RolloutBackend(Protocol):
    name: str

    def generate(self, prompts: TensorBatch, sampling: Sampling, stop: Callable[[], bool] | None = None,
                 row_limits: torch.Tensor | None = None) -> TensorBatch:
        """[b, P] left-padded `input_ids` + `attention_mask` (on the CPU) -> rows (on the CPU).

        Partial rollouts (engine.rollout.partial) pass `stop`: once it is true the rows end where they are and say
        how many tokens each has (`generated_tokens`); and, for rows being finished, `row_limits` ([b]): each
        row's own limit (at most sampling.max_new_tokens; a backend may generate past it, the caller cuts)."""

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Take the actor's weights, one full tensor at a time (HF parameter names)."""

    def release(self) -> None:
        """Give back what the backend can while the actor trains (no-op where nothing can be freed)."""

    def timings(self) -> dict[str, float]:
        """Seconds spent in the backend's parts since the last call (metrics), then reset."""


def add_backend_timings(total: dict[str, float], more: dict[str, float]) -> dict[str, float]:
    """Two generate calls' backend `timings()` of one rank as one: seconds add up; a memory figure (`*_gb`) or a
    median of one call's engine steps is not a sum, so the larger stands for both."""
    out = dict(total)
    for key, value in more.items():
        if key.endswith("_gb") or key.endswith("_median"):
            out[key] = max(out.get(key, value), value)
        else:
            out[key] = out.get(key, 0.0) + value
    return out


def mask_after_eos(responses: torch.Tensor, eos_token_id: int, ignore_eos: bool) -> torch.Tensor:
    """1 for response tokens up to and including the first EOS, 0 after it (padding)."""
    if ignore_eos:
        return torch.ones_like(responses)
    is_eos = (responses == eos_token_id).long()
    # Tokens strictly after the first EOS have a positive count of EOS before them.
    eos_before = is_eos.cumsum(-1) - is_eos
    return (eos_before == 0).long()


def assemble_rows(prompts: TensorBatch, responses: torch.Tensor, eos_token_id: int, ignore_eos: bool,
                  rollout_log_probs: torch.Tensor | None = None) -> TensorBatch:
    """Prompt rows + [b, R] responses (pad after the end) -> the rows the trainer reads, on the CPU."""
    prompts = {name: t.cpu() for name, t in prompts.items()}
    responses = responses.cpu()
    response_mask = mask_after_eos(responses, eos_token_id, ignore_eos)
    attention_mask = torch.cat([prompts["attention_mask"], response_mask], dim=1)
    rows = {
        "input_ids": torch.cat([prompts["input_ids"], responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "responses": responses,
        "response_mask": response_mask,
    }
    if rollout_log_probs is not None:
        # where, not a product: after the end a sampler may record -inf (a pad token top-k removed).
        rows["rollout_log_probs"] = torch.where(response_mask.bool(), rollout_log_probs.cpu().float(), 0.0)
    return rows


def prompt_token_lists(prompts: TensorBatch) -> list[list[int]]:
    """Each left-padded prompt row without its padding."""
    return masked_rows(prompts["input_ids"], prompts["attention_mask"])
