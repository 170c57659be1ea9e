"""The whole plan: top-level sections with verl's names plus rlconf's `placement` and `estimate`."""

from typing import Any

from pydantic import Field, model_validator

from rlconf.schema.actor import ActorConfig, CriticConfig, RefConfig
from rlconf.schema.common import Section
from rlconf.schema.model import ActorModel
from rlconf.schema.rollout import RolloutConfig
from rlconf.schema.sections import (
    AlgorithmConfig,
    AsyncTrainingConfig,
    CustomRewardFunction,
    DataConfig,
    EstimateConfig,
    PlacementConfig,
    RewardModelConfig,
    TrainerConfig,
)

# verl defaults that are another key's value (`${...}` in its config), for keys the engine reads
# directly: an unset key takes the value the plan gives the key it follows, as OmegaConf resolves
# it in verl. The other followers are `null` in the schema and resolve in rlconf/normalize.py.
COPIED_DEFAULTS: dict[str, str] = {
    "critic.shuffle": "actor_rollout_ref.actor.shuffle",
    "actor_rollout_ref.actor.checkpoint.load_contents": "actor_rollout_ref.actor.checkpoint.save_contents",
    "critic.checkpoint.load_contents": "critic.checkpoint.save_contents",
}


def _lookup(data: Any, dotted: str) -> Any:
    for part in dotted.split("."):
        if not isinstance(data, dict) or data.get(part) is None:
            return None
        data = data[part]
    return data


def _with_value(data: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    """A copy of `data` with `dotted` set (copies only the mappings on the way; the input stays as read)."""
    head, _, rest = dotted.partition(".")
    out = dict(data)
    if not rest:
        out[head] = value
    elif isinstance(out.get(head, {}), dict):
        out[head] = _with_value(out.get(head) or {}, rest, value)
    return out


class ActorRolloutRefConfig(Section):
    model: ActorModel = Field(default_factory=ActorModel)
    actor: ActorConfig = Field(default_factory=ActorConfig)
    rollout: RolloutConfig = Field(default_factory=RolloutConfig)
    ref: RefConfig = Field(default_factory=RefConfig)
    # true: rollout shares the actor's GPUs and steps take turns (verl's hybrid engine). false: rollout runs on a
    # pool of its own (rollout.nnodes, rollout.n_gpus_per_node) one step ahead of training, verl 0.9.1's one-step
    # off-policy trainer (docs/off-policy.md).
    hybrid_engine: bool = True


class PlanConfig(Section):
    data: DataConfig = Field(default_factory=DataConfig)
    actor_rollout_ref: ActorRolloutRefConfig = Field(default_factory=ActorRolloutRefConfig)
    critic: CriticConfig = Field(default_factory=CriticConfig)
    reward_model: RewardModelConfig = Field(default_factory=RewardModelConfig)
    custom_reward_function: CustomRewardFunction = Field(default_factory=CustomRewardFunction)
    algorithm: AlgorithmConfig = Field(default_factory=AlgorithmConfig)
    trainer: TrainerConfig = Field(default_factory=TrainerConfig)
    placement: PlacementConfig | None = None
    async_training: AsyncTrainingConfig | None = None  # verl's fully async mode when written (docs/off-policy.md)
    estimate: EstimateConfig = Field(default_factory=EstimateConfig)

    @model_validator(mode="before")
    @classmethod
    def _copy_followed_defaults(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        for follower, followed in COPIED_DEFAULTS.items():
            value = _lookup(data, followed)
            if value is not None and _lookup(data, follower) is None:
                data = _with_value(data, follower, value)
        return data
