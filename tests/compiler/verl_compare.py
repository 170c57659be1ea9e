"""rlconf's resolved numbers beside the oracle's (`verl_reference.verl_normalize`), in one shape for both.

One check wherever "rlconf resolves the numbers verl computes" is asserted: test_verl_agreement,
test_verl_examples and bench/verl_examples.py (which calls a difference a misread) all use it.
Like the oracle, nothing here imports rlconf: the resolved roles are read by attribute.
"""

from __future__ import annotations

from typing import Any

MISSING = "missing"  # a part of a role rlconf's resolved plan lacks where verl has it


def nest(flat: dict[str, Any]) -> dict[str, Any]:
    """{"a.b": 1} -> {"a": {"b": 1}}: dotted overrides as the nested plan the oracle reads."""
    out: dict[str, Any] = {}
    for dotted, value in flat.items():
        node = out
        *parents, leaf = dotted.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = value
    return out


def _update_view(role) -> dict[str, Any]:
    return {
        "dp_size": role.dp_size,
        "sequences_per_gpu": role.sequences_per_gpu,
        "ppo_mini_batch_size_per_gpu": role.ppo_mini_batch_size_per_gpu,
        "ppo_micro_batch_size_per_gpu": role.ppo_micro_batch_size_per_gpu,
        "grad_accum_steps": role.grad_accum_steps,
        "optimizer_steps_per_train_step": role.optimizer_steps_per_train_step,
    }


def resolved_numbers(roles) -> dict[str, dict[str, Any] | None]:
    """The numbers of rlconf's resolved roles that the oracle computes too, keyed as its VerlResult is."""
    rollout = roles.rollout
    ref = None
    if roles.ref is not None:
        ref = {"micro_batch_size_per_gpu": roles.ref.micro_batch_size_per_gpu,
               "micro_batches_per_gpu": roles.ref.micro_batches_per_gpu}
    critic = None
    if roles.critic is not None or roles.critic_values is not None:
        # verl's critic both updates and computes values: rlconf must resolve both passes.
        update = _update_view(roles.critic) if roles.critic is not None else {"update pass": MISSING}
        values = ({"forward_micro_batch_size_per_gpu": roles.critic_values.micro_batch_size_per_gpu,
                   "forward_micro_batches_per_gpu": roles.critic_values.micro_batches_per_gpu}
                  if roles.critic_values is not None else {"values pass": MISSING})
        critic = {**update, **values}
    return {
        "actor": _update_view(roles.actor),
        "rollout": {
            "replicas": rollout.replicas,
            "sequences_per_replica": rollout.sequences_per_replica,
            "log_prob_micro_batch_size_per_gpu": rollout.log_prob.micro_batch_size_per_gpu,
            "log_prob_micro_batches_per_gpu": rollout.log_prob.micro_batches_per_gpu,
        },
        "ref": ref,
        "critic": critic,
    }


def number_differences(roles, verl) -> list[str]:
    """Each number where rlconf's resolved roles and verl's workers part, as `role.key: rlconf X, verl Y`;
    empty when they agree (the rollout replicas and every per-GPU number of actor, rollout, ref, critic)."""
    ours = resolved_numbers(roles)
    theirs = {"actor": verl.actor, "rollout": verl.rollout, "ref": verl.ref, "critic": verl.critic}
    differences = []
    for role, verl_numbers in theirs.items():
        rlconf_numbers = ours[role]
        if rlconf_numbers is None or verl_numbers is None:
            if (rlconf_numbers is None) != (verl_numbers is None):
                differences.append(f"{role}: rlconf {'has none' if rlconf_numbers is None else 'runs one'}, "
                                   f"verl {'has none' if verl_numbers is None else 'runs one'}")
            continue
        for key in [*verl_numbers, *(k for k in rlconf_numbers if k not in verl_numbers)]:
            mine, verls = rlconf_numbers.get(key, MISSING), verl_numbers.get(key, MISSING)
            if mine != verls:
                differences.append(f"{role}.{key}: rlconf {mine}, verl {verls}")
    return differences


def assert_same_numbers(roles, verl) -> None:
    """rlconf's resolved roles hold the per-GPU numbers and replicas verl's workers end up with."""
    differences = number_differences(roles, verl)
    assert not differences, "\n".join(differences)
