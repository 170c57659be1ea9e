"""DAPO's soft overlong punishment (verl's ``dapo`` reward manager): a response that runs into the last
``len`` tokens before ``max_resp_len`` loses reward in proportion to how far it runs in.

With ``expected = max_resp_len - len`` and a response of ``L`` valid tokens, the penalty added to its
score is ``min(-(L - expected) / len * penalty_factor, 0)``: 0 up to ``expected`` tokens, falling
linearly to ``-penalty_factor`` at ``max_resp_len`` (and further below past it, as verl).
"""

from __future__ import annotations

import torch

from rlconf.schema.sections import RewardModelConfig


def overlong_penalty(lengths: torch.Tensor, max_resp_len: int, buffer_len: int, penalty_factor: float) -> torch.Tensor:
    """``[B]`` penalties (<= 0) for responses of ``lengths`` valid tokens."""
    expected = max_resp_len - buffer_len
    return torch.clamp(-(lengths.to(torch.float32) - expected) / buffer_len * penalty_factor, max=0.0)


def dapo_penalties(reward_model: RewardModelConfig, lengths: torch.Tensor) -> torch.Tensor | None:
    """The plan's overlong penalties for these response lengths; None when the plan has none
    (reward_manager is not dapo, or its overlong buffer is absent or off)."""
    kwargs = reward_model.reward_kwargs
    cfg = kwargs.overlong_buffer_cfg
    if reward_model.reward_manager != "dapo" or cfg is None or not cfg.enable:
        return None
    if kwargs.max_resp_len is None:  # the compiler refuses this (RL521)
        raise ValueError("reward_kwargs.overlong_buffer_cfg is enabled without reward_kwargs.max_resp_len")
    return overlong_penalty(lengths, kwargs.max_resp_len, cfg.len, cfg.penalty_factor)


def overlong_metrics(penalties: torch.Tensor) -> dict[str, float]:
    """overlong_buffer_cfg.log: the mean penalty and the fraction of responses penalised."""
    return {"reward/overlong_reward/mean": float(penalties.mean()),
            "reward/overlong/fraction": float((penalties < 0).float().mean())}
