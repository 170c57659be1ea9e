"""verl values this engine does not run (RL108 / RL109), and the checks verl makes that a plan
pasted from verl must also pass here (RL518-RL520)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.schema import PlanConfig
from rlconf.schema.verl_compat import NOT_RUN_VALUES
from rlconf.schema.verl_only import not_run_diagnostic

VERL_DEFAULT_CLIP = 0.2


def _value_and_default(plan: PlanConfig, dotted: str) -> tuple[Any, Any]:
    parent: Any = None
    node: Any = plan
    for part in dotted.split("."):
        parent, node = node, getattr(node, part)
    return node, type(parent).model_fields[dotted.rpartition(".")[2]].get_default(call_default_factory=True)


def check_verl_values(plan: PlanConfig) -> Iterator[Diagnostic]:
    for key, values in NOT_RUN_VALUES.items():
        value, default = _value_and_default(plan, key)
        for index, item in enumerate(value) if isinstance(value, list) else [(None, value)]:
            if item in values:
                where = key if index is None else f"{key}[{index}]"
                yield not_run_diagnostic(where, item, default, "", values[item])
    rollout = plan.actor_rollout_ref.rollout
    if rollout.name == "hf" and rollout.tensor_model_parallel_size > 1:
        yield error("RL518", "actor_rollout_ref.rollout.tensor_model_parallel_size",
                    f"rollout.name hf with tensor_model_parallel_size {rollout.tensor_model_parallel_size}: HF generate runs "
                    "a full copy of the model on every rank, it does not split one over several",
                    help="set actor_rollout_ref.rollout.tensor_model_parallel_size=1 (verl's default is 2, for vLLM)")
    if rollout.val_kwargs.do_sample and rollout.temperature == 0:
        # verl/utils/config.py validate_config asserts this (it checks the rollout temperature, not val_kwargs').
        yield error("RL519", "actor_rollout_ref.rollout.temperature",
                    "validation sampling is on (val_kwargs.do_sample) while rollout.temperature is 0; verl refuses this plan",
                    help="set actor_rollout_ref.rollout.temperature > 0, or val_kwargs.do_sample: false")
    actor = plan.actor_rollout_ref.actor
    if actor.clip_ratio != VERL_DEFAULT_CLIP and actor.clip_ratio_low is not None and actor.clip_ratio_high is not None:
        yield warning("RL520", "actor_rollout_ref.actor.clip_ratio",
                      f"clip_ratio {actor.clip_ratio} has no effect: clip_ratio_low {actor.clip_ratio_low} and clip_ratio_high "
                      f"{actor.clip_ratio_high} are set (verl's defaults are 0.2), and they bound the ratio, as in verl",
                      help="set clip_ratio_low and clip_ratio_high instead (or null them to fall back to clip_ratio)")
