"""Rules: checks over a schema-valid plan and its normalization. Each yields Diagnostics with
stable codes (catalogue: rlconf/rules/catalog.py, docs/rules.md)."""

from __future__ import annotations

from rlconf.diagnostics import Diagnostic
from rlconf.modelinfo import ModelInfo
from rlconf.normalize import Normalized
from rlconf.rules.algorithm import check_algorithm
from rlconf.rules.batch import check_batches
from rlconf.rules.deprecated import check_deprecated
from rlconf.rules.dynamic import check_token_budgets
from rlconf.rules.offpolicy import check_rollout_pool
from rlconf.rules.parallel import check_parallel, check_placement
from rlconf.rules.paths import check_paths
from rlconf.rules.reward_loop import check_reward_loop
from rlconf.rules.reward_model import check_reward_model
from rlconf.rules.sampling import check_filter_groups, check_generation_batch
from rlconf.rules.tuning import check_tuning
from rlconf.rules.verl import check_verl_values
from rlconf.schema import PlanConfig


def run_rules(plan: PlanConfig, norm: Normalized, model: ModelInfo | None, raw: dict,
              reward_model: ModelInfo | None = None) -> list[Diagnostic]:
    """`model`: the policy's (actor_rollout_ref.model.path); `reward_model`: the FSDP reward-model worker's."""
    found: list[Diagnostic] = []
    found += check_deprecated(raw)
    found += check_placement(plan, norm)
    found += check_rollout_pool(plan, norm)
    found += check_parallel(plan, norm, model)
    found += check_batches(plan, norm)
    found += check_token_budgets(plan, norm)
    found += check_algorithm(plan, norm, model)
    found += check_filter_groups(plan)
    found += check_generation_batch(plan, norm)
    found += check_tuning(plan, norm, model)
    found += check_verl_values(plan)
    found += check_reward_model(plan, norm, model, reward_model)
    found += check_reward_loop(plan, norm, raw)
    found += check_paths(plan)
    return found
