"""Optimizer and learning-rate schedule (AdamW with warmup and decay)."""

from typing import Literal

from pydantic import Field

from rlconf.schema.common import NonNegativeFloat, PositiveFloat, Section, UnitInterval


class OptimConfig(Section):
    lr: PositiveFloat = 1e-6  # Peak learning rate (AdamW).
    # -1: derive warmup from lr_warmup_steps_ratio × total training steps.
    lr_warmup_steps: int = Field(default=-1, ge=-1)
    lr_warmup_steps_ratio: UnitInterval = 0.0  # Warmup as a fraction of total steps (when lr_warmup_steps is -1).
    min_lr_ratio: UnitInterval = 0.0  # Cosine schedule floor as a fraction of lr.
    num_cycles: NonNegativeFloat = 0.5  # Cosine cycles over training.
    lr_scheduler_type: Literal["constant", "cosine"] = "constant"  # Schedule after warmup.
    warmup_style: Literal["constant", "cosine"] | None = None  # deprecated in verl: when set, it replaces lr_scheduler_type.
    weight_decay: NonNegativeFloat = 0.01  # AdamW weight decay.
    betas: list[UnitInterval] = Field(default=[0.9, 0.999], min_length=2, max_length=2)  # AdamW betas.
    # -1: filled in from the data size and trainer.total_epochs / total_training_steps.
    total_training_steps: int = Field(default=-1, ge=-1)

    @property
    def schedule(self) -> str:
        """The schedule after warmup: verl lets the deprecated warmup_style win when it is set."""
        return self.warmup_style or self.lr_scheduler_type
