"""Shared building blocks of the plan schema: the strict base model and constrained types."""

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

# Sizes flow into int32 indexing in kernels and samplers; anything larger is a typo.
MAX_SIZE = 2**31 - 1

PositiveInt = Annotated[int, Field(gt=0, le=MAX_SIZE)]
NonNegativeInt = Annotated[int, Field(ge=0, le=MAX_SIZE)]
Fraction = Annotated[float, Field(gt=0.0, le=1.0)]
UnitInterval = Annotated[float, Field(ge=0.0, le=1.0)]
NonNegativeFloat = Annotated[float, Field(ge=0.0)]
PositiveFloat = Annotated[float, Field(gt=0.0)]
# verl's KL estimators (core_algos.py kl_penalty), for the KL loss and the in-reward penalty. A name ending in `+`
# takes the value of the estimator it names and the gradient of k2 (a straight-through estimator): k1 and k3 are
# unbiased for KL's value but not for its gradient, k2 is right for the gradient.
KLEstimator = Literal["kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3",
                      "kl+", "k1+", "abs+", "mse+", "k2+", "low_var_kl+", "k3+"]
# verl spells "no limit"/"disabled" as -1 in a few places (top_k, save_freq, test_freq, ...).
MinusOneOrPositive = Annotated[int, Field(ge=-1, le=MAX_SIZE)]


class Section(BaseModel):
    """A plan section: unknown keys are errors, numbers are finite, nothing is coerced silently."""

    # defer_build: build one validator for the whole plan on first use instead of one per section
    # at import (halves the cold start of `rlconf validate`).
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False, validate_default=True, frozen=True, defer_build=True,
                              strict=True)  # YAML types are explicit: `true` is not a batch size of 1


# Deprecated spelling -> replacement, relative to the section that holds them.
# verl treats the deprecated `*_micro_batch_size` values as *global* and divides them by the
# data-parallel size; the compiler does the same (see rlconf/normalize.py).
DEPRECATED_KEYS: dict[str, str] = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "critic.forward_micro_batch_size": "critic.forward_micro_batch_size_per_gpu",
    "reward_model.micro_batch_size": "reward_model.micro_batch_size_per_gpu",
}
