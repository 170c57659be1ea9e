"""Batches shaped as the rollout writes them, for engine tests: [prompt (left-padded) | response (right-padded)]."""

from __future__ import annotations

import torch


def rollout_rows(prompt_lengths: torch.Tensor | list[int], response_lengths: torch.Tensor | list[int],
                 prompt_width: int, response_width: int, generator: torch.Generator) -> dict[str, torch.Tensor]:
    """Random token ids (10..249) in the real positions, zeros in the padding; masks and position ids to match."""
    from engine.batch import position_ids_from_mask

    rows = len(prompt_lengths)
    prompt_mask = (torch.arange(prompt_width) >= prompt_width - torch.as_tensor(prompt_lengths)[:, None]).long()
    response_mask = (torch.arange(response_width) < torch.as_tensor(response_lengths)[:, None]).long()
    responses = torch.randint(10, 250, (rows, response_width), generator=generator)
    prompts = torch.randint(10, 250, (rows, prompt_width), generator=generator) * prompt_mask
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return {
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids_from_mask(attention_mask),
        "responses": responses,
        "response_mask": response_mask,
    }


def recomputing_old_log_probs(resolved):
    """`resolved` with π_old taken from the batch's `old_log_probs` (a recomputed pass), not from the
    update's own forward: tests that hand the update old log-probs apart from the current policy's
    (to exercise the clip) need that, though their one-optimizer-step plans would skip the pass."""
    rollout = resolved.roles.rollout.model_copy(update={"old_log_probs": "recompute"})
    return resolved.model_copy(update={"roles": resolved.roles.model_copy(update={"rollout": rollout})})
