"""The whole plan: top-level sections with verl's names plus rlconf's `placement` and `estimate`."""

from __future__ import annotations

from pydantic import Field

from rlconf.schema.actor import ActorConfig, CriticConfig, RefConfig
from rlconf.schema.common import Section
from rlconf.schema.model import ActorModel
from rlconf.schema.rollout import RolloutConfig
from rlconf.schema.sections import (
    AlgorithmConfig,
    CustomRewardFunction,
    DataConfig,
    EstimateConfig,
    PlacementConfig,
    RewardModelConfig,
    TrainerConfig,
)


class ActorRolloutRefConfig(Section):
    model: ActorModel = Field(default_factory=ActorModel)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    ref: RefConfig = Field(default_factory=RefConfig)


class PlanConfig(Section):
    data: DataConfig = Field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = Field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunction = Field(default_factory=CustomRewardFunction)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    placement: PlacementConfig | None = None
    estimate: EstimateConfig = Field(default_factory=EstimateConfig)
