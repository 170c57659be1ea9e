"""Batch-size rules (RL2xx): the checks verl asserts inside its trainer and workers, made early.

References are to volcengine/verl (see docs/rules.md for the table of sources).
"""

from __future__ import annotations

from collections.abc import Iterator

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.normalize import ForwardPass, Normalized, TrainPass
from rlconf.rules.arith import nearest_divisors, nearest_multiples, or_list
from rlconf.schema import PlanConfig

ACTOR = "actor_rollout_ref.actor"


def check_batches(plan: PlanConfig, norm: Normalized) -> Iterator[Diagnostic]:
    yield from _world_divides_step(plan, norm)
    yield from _train_pass(plan, norm.actor, ACTOR)
    if norm.critic is not None:
        yield from _train_pass(plan, norm.critic, "critic")
    for fwd in (norm.rollout.log_prob, norm.ref, norm.critic_values, norm.reward_model):
        if fwd is not None:
            yield from _forward_pass(fwd)


def _world_divides_step(plan: PlanConfig, norm: Normalized) -> Iterator[Diagnostic]:
    """verl ray_trainer._validate_config: train_batch_size × n must split evenly over all GPUs
    (each worker group chunks the batch by its world size)."""
    sequences = norm.sequences_per_step.value
    n = norm.rollout_n
    train = plan.data.train_batch_size
    groups = {"the cluster": norm.placement.cluster_gpus}
    for role, pool_name in norm.placement.roles.items():
        pool = norm.placement.pools.get(pool_name)
        if pool is not None:
            groups.setdefault(f"pool `{pool_name}`", pool.gpus)
    for where, gpus in groups.items():
        if gpus and sequences % gpus:
            yield error(
                "RL201", "data.train_batch_size",
                f"train_batch_size {train} × rollout.n {n} = {sequences} sequences do not split evenly over {where}'s {gpus} GPUs",
                note=f"{sequences} ÷ {gpus} = {sequences / gpus:g}",
                help=f"make train_batch_size a multiple of {_lcm_step(gpus, n)} (e.g. {or_list(nearest_multiples(_lcm_step(gpus, n), train))})",
            )
            return


def _lcm_step(gpus: int, n: int) -> int:
    """Smallest train_batch_size step so that train × n is a multiple of gpus."""
    from math import gcd

    return gpus // gcd(gpus, n)


def _train_pass(plan: PlanConfig, p: TrainPass, section: str) -> Iterator[Diagnostic]:
    if not p.pool_gpus:
        return  # the role has no (defined) pool: RL352/RL353 report that, sizes per GPU mean nothing
    train = plan.data.train_batch_size
    mini_key = f"{section}.ppo_mini_batch_size"
    if p.ppo_mini_batch_size > train:
        yield error("RL202", mini_key, f"{p.role} ppo_mini_batch_size {p.ppo_mini_batch_size} is larger than data.train_batch_size {train}",
                    help=f"use at most {train}; a mini batch is a slice of one step's prompts")
        return
    if not p.mini_batches_per_epoch.exact:
        yield warning("RL207", mini_key,
                      f"data.train_batch_size {train} is not a multiple of {p.role} ppo_mini_batch_size {p.ppo_mini_batch_size}: the last mini batch of each epoch is smaller",
                      note=p.mini_batches_per_epoch.formula,
                      help=f"use a divisor of {train} ({or_list(nearest_divisors(train, p.ppo_mini_batch_size))})")
    if p.dp_size.value is None or not p.dp_size.exact:
        return  # RL301 reports the parallel sizes; nothing below is defined
    mini = p.ppo_mini_batch_size_per_gpu
    if not mini.exact or not mini.value:
        step = p.dp_size.value // _gcd(p.dp_size.value, plan.actor_rollout_ref.rollout.n)
        yield error("RL203", mini_key,
                    f"{p.role} ppo_mini_batch_size {p.ppo_mini_batch_size} × n does not split evenly over {p.dp_size.value} data-parallel ranks",
                    note=mini.formula,
                    help=f"make ppo_mini_batch_size a multiple of {step} (e.g. {or_list(nearest_multiples(step, p.ppo_mini_batch_size))})")
        return
    deprecated_key = f"{section}.ppo_micro_batch_size"
    yield from _deprecated_split(p.deprecated_micro, p.ppo_micro_batch_size_per_gpu, p.dp_size.value, deprecated_key)
    micro = p.ppo_micro_batch_size_per_gpu
    if p.use_dynamic_bsz:
        return
    if micro is None:
        yield error("RL205", f"{section}.ppo_micro_batch_size_per_gpu",
                    f"{p.role} has no micro batch size: set ppo_micro_batch_size_per_gpu or use_dynamic_bsz",
                    help=f"e.g. `ppo_micro_batch_size_per_gpu: {nearest_divisors(mini.value, 8, 1)[0]}` (a divisor of the per-GPU mini batch {mini.value})")
        return
    if not micro.value:
        return
    micro_key = f"{section}.ppo_micro_batch_size_per_gpu" if p.deprecated_micro is None else deprecated_key
    if micro.value > mini.value:
        yield error("RL204", micro_key,
                    f"{p.role} ppo_micro_batch_size_per_gpu {micro.value} is larger than its mini batch per GPU {mini.value}",
                    note=mini.formula,
                    help=f"use at most {mini.value} ({or_list(nearest_divisors(mini.value, micro.value))})")
    elif mini.value % micro.value:
        yield error("RL204", micro_key,
                    f"{p.role} ppo_mini_batch_size is {mini.value} per GPU after normalization, not divisible by ppo_micro_batch_size_per_gpu {micro.value}",
                    note=mini.formula,
                    help=(f"use a divisor of {mini.value} ({or_list(nearest_divisors(mini.value, micro.value))}), or make "
                          f"ppo_mini_batch_size a multiple of {_mini_step(p, micro.value, plan.actor_rollout_ref.rollout.n)}"))


def _mini_step(p: TrainPass, micro: int, n: int) -> int:
    """Smallest ppo_mini_batch_size step that makes mini × n ÷ dp a multiple of micro."""
    need = micro * p.dp_size.value
    return need // _gcd(need, n)


def _gcd(a: int, b: int) -> int:
    from math import gcd

    return gcd(a, b)


def _deprecated_split(deprecated: int | None, micro, dp: int, key: str) -> Iterator[Diagnostic]:
    """verl divides a deprecated global micro batch by dp with `//=`; a remainder is lost silently."""
    if deprecated is None or micro is None:
        return
    if not micro.exact or not micro.value:
        yield error("RL206", key,
                    f"deprecated global `{key.rpartition('.')[2]}` {deprecated} does not split evenly over {dp} data-parallel ranks",
                    note=micro.formula,
                    help=f"set `{key.rpartition('.')[2]}_per_gpu` instead (e.g. {max(1, deprecated // dp)})")


def _forward_pass(p: ForwardPass) -> Iterator[Diagnostic]:
    if not p.pool_gpus or p.dp_size.value is None or not p.dp_size.exact:
        return
    yield from _deprecated_split(p.deprecated_micro, p.micro_batch_size_per_gpu, p.dp_size.value, p.micro_key)
    if p.use_dynamic_bsz or p.micro_batch_size_per_gpu is not None:
        return
    if p.role == "critic" and p.micro_key.endswith("forward_micro_batch_size"):
        return  # inherits critic.ppo_micro_batch_size_per_gpu, whose absence is reported already
    if p.role == "reward_model":
        return  # verl 0.9's reward model (served by its reward loop) has no micro batch to require
    yield error("RL205", f"{p.micro_key}_per_gpu",
                f"{p.role} forward pass has no micro batch size: set {p.micro_key.rpartition('.')[2]}_per_gpu or enable dynamic batch size",
                help=f"e.g. `{p.micro_key.rpartition('.')[2]}_per_gpu: 16`; forward-only micro batches can be ~2× the training ones")
