"""DAPO dynamic sampling (algorithm.filter_groups): checks that the filter can keep any group."""

from __future__ import annotations

from collections.abc import Iterator

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.normalize import is_group_estimator
from rlconf.schema import PlanConfig

# Filter metrics this engine computes per response (see FilterMetric in rlconf/schema/sections.py).
RUN_METRICS = ("score", "seq_reward", "seq_final_reward")


def check_filter_groups(plan: PlanConfig) -> Iterator[Diagnostic]:
    algo, n = plan.algorithm, plan.actor_rollout_ref.rollout.n
    filter_groups = algo.filter_groups
    if not filter_groups.enable:
        return
    if filter_groups.metric not in RUN_METRICS:
        yield error("RL522", "algorithm.filter_groups.metric",
                    f"filter metric `{filter_groups.metric}` is not computed per response by this engine (verl reads it "
                    "from the reward function's extra info); it computes score, seq_reward and seq_final_reward",
                    help="use `score` (the scorer's score) or `seq_reward` (with any overlong penalty)")
    elif filter_groups.metric == "seq_final_reward" and algo.use_kl_in_reward:
        yield error("RL522", "algorithm.filter_groups.metric",
                    "`seq_final_reward` includes the in-reward KL penalty, which is computed after groups are filtered here",
                    help="filter on `seq_reward` (the reward before the KL penalty)")
    if n < 2:
        yield error("RL522", "algorithm.filter_groups.enable",
                    f"rollout.n is {n}: every group has one response, so every group would be filtered out",
                    help="set actor_rollout_ref.rollout.n to at least 2, or filter_groups.enable: false")
    elif not is_group_estimator(plan):
        yield warning("RL523", "algorithm.filter_groups.enable",
                      f"adv_estimator `{algo.adv_estimator}` does not compare a prompt's responses: groups whose "
                      "responses score the same still carry signal, and filtering them drops it",
                      help="use a group estimator (grpo, rloo, ...) with filter_groups, or turn it off")
