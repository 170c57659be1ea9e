"""Optimizer and learning-rate schedule (AdamW with warmup and decay)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from rlconf.schema.common import NonNegativeFloat, PositiveFloat, Section, UnitInterval


class OptimConfig(Section):
    lr: PositiveFloat = 1e-6
    # -1: derive warmup from lr_warmup_steps_ratio × total training steps.
    lr_warmup_steps: int = Field(default=-1, ge=-1)
    lr_warmup_steps_ratio: UnitInterval = 0.0
    min_lr_ratio: UnitInterval = 0.0
    num_cycles: NonNegativeFloat = 0.5
    warmup_style: Literal["constant", "cosine"] = "constant"
    weight_decay: NonNegativeFloat = 0.01
    betas: tuple[UnitInterval, UnitInterval] = (0.9, 0.999)
    # -1: filled in from the data size and trainer.total_epochs / total_training_steps.
    total_training_steps: int = Field(default=-1, ge=-1)
