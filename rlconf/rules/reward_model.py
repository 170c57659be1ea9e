"""The reward model's own rules (reward_model.enable): what it needs, and what it replaces in the reward.

rlconf runs the tuning guide's reward model as a FSDP scorer (engine/workers/roles/reward_model.py):
its score at the last token of each (prompt, response) is the reward. As verl's reward managers do
when reward-model scores exist, the rule scorer (custom_reward_function, the data source's scorer)
and DAPO's overlong penalty do not enter that reward.
"""

from __future__ import annotations

from collections.abc import Iterator

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.schema import PlanConfig


def check_reward_model(plan: PlanConfig) -> Iterator[Diagnostic]:
    rm = plan.reward_model
    if not rm.enable:
        return
    if not rm.model.path:
        yield error("RL531", "reward_model.model.path",
                    "reward_model.enable is true, but reward_model.model.path names no model to score with",
                    help="set reward_model.model.path to a reward model (a sequence- or token-classification "
                         "checkpoint with one label), e.g. `tiny://qwen2-reward` for a CPU dry run")
    replaced = []
    if plan.custom_reward_function.path:
        replaced.append(f"custom_reward_function ({plan.custom_reward_function.path})")
    if rm.reward_manager in ("batch", "prime"):
        replaced.append(f"the {rm.reward_manager} reward manager's scoring")
    if rm.reward_manager == "dapo" and rm.reward_kwargs.overlong_buffer_cfg and rm.reward_kwargs.overlong_buffer_cfg.enable:
        replaced.append("the dapo overlong penalty")
    if replaced:
        yield warning("RL532", "reward_model.enable",
                      f"with reward_model.enable the reward model's scores are the reward: {' and '.join(replaced)} "
                      "will not be applied (verl's reward managers return the model's scores as they are)",
                      help="turn the reward model off to reward with rules, or drop what it replaces")
