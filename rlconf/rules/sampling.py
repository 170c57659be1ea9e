"""DAPO dynamic sampling (algorithm.filter_groups): checks that the filter can keep any group, and that
the generation rounds (data.gen_batch_size prompts each) can fill a training batch."""

from __future__ import annotations

from collections.abc import Iterator
from math import gcd

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.normalize import Normalized, is_group_estimator
from rlconf.rules.arith import nearest_multiples, or_list
from rlconf.schema import PlanConfig

# Filter metrics this engine computes per response (see FilterMetric in rlconf/schema/sections.py).
RUN_METRICS = ("score", "reward", "seq_reward", "seq_final_reward")


def check_filter_groups(plan: PlanConfig) -> Iterator[Diagnostic]:
    algo, n = plan.algorithm, plan.actor_rollout_ref.rollout.n
    filter_groups = algo.filter_groups
    if not filter_groups.enable:
        return
    if filter_groups.metric not in RUN_METRICS:
        yield error("RL522", "algorithm.filter_groups.metric",
                    f"filter metric `{filter_groups.metric}` is not computed per response by this engine (verl reads it "
                    "from the reward function's extra info); it computes score, reward, seq_reward and seq_final_reward",
                    help="use `score` (the scorer's score) or `reward` (verl's canonical reward, with any overlong penalty)")
    elif filter_groups.metric == "seq_final_reward" and algo.use_kl_in_reward:
        yield error("RL522", "algorithm.filter_groups.metric",
                    "`seq_final_reward` includes the in-reward KL penalty, which is computed after groups are filtered here",
                    help="filter on `seq_reward` (the reward before the KL penalty)")
    if n < 2:
        # verl 0.9.1 (trainer/ppo/v1/replay_buffer.py L310-312) filters only groups of 2 or more: it runs, unfiltered.
        yield warning("RL523", "algorithm.filter_groups.enable",
                      f"rollout.n is {n}: every group is one response, which verl keeps, so filter_groups filters nothing",
                      help="set actor_rollout_ref.rollout.n to at least 2 for the filter to act, or filter_groups.enable: false")
    elif not is_group_estimator(plan):
        yield warning("RL523", "algorithm.filter_groups.enable",
                      f"adv_estimator `{algo.adv_estimator}` does not compare a prompt's responses: groups whose "
                      "responses score the same still carry signal, and filtering them drops it",
                      help="use a group estimator (grpo, rloo, ...) with filter_groups, or turn it off")


def check_generation_batch(plan: PlanConfig, norm: Normalized) -> Iterator[Diagnostic]:
    """data.gen_batch_size: the prompts of one generation round (verl batches its train dataloader by it)."""
    gen, train = plan.data.gen_batch_size, plan.data.train_batch_size
    if gen is None or gen == train:
        return  # the generation batch is the training batch: RL201 checks its split
    key, filter_groups = "data.gen_batch_size", plan.algorithm.filter_groups
    if not filter_groups.enable:
        # verl (ray_trainer, the DAPO recipe with the filter off) trains on the whole generation batch:
        # gen_batch_size prompts a step, while the mini-batch checks were made for train_batch_size.
        yield error("RL524", key,
                    f"gen_batch_size {gen} differs from train_batch_size {train} without algorithm.filter_groups: "
                    f"verl would train on all {gen} generated prompts a step, not on {train}",
                    help=f"set data.train_batch_size: {gen} and drop gen_batch_size, or enable algorithm.filter_groups "
                         "to keep train_batch_size informative groups out of each generation batch")
        return
    rounds = -(-train // gen)  # rounds needed even when every group is kept
    limit = filter_groups.max_num_gen_batches
    if 0 < limit < rounds:
        yield error("RL524", key,
                    f"{limit} generation batches of {gen} prompts hold at most {limit * gen} groups, fewer than "
                    f"train_batch_size {train}: every step would stop at algorithm.filter_groups.max_num_gen_batches",
                    note=f"⌈{train} ÷ {gen}⌉ = {rounds} rounds at least",
                    help=f"raise gen_batch_size to at least {-(-train // limit)}, or max_num_gen_batches to at least {rounds}")
    elif gen < train:
        yield warning("RL524", key,
                      f"gen_batch_size {gen} is smaller than train_batch_size {train}: every step takes at least {rounds} "
                      f"generation rounds, yet an epoch counts one step per {gen} prompts (verl's dataloader), so the "
                      f"run's steps go over the data at least {rounds} × total_epochs times",
                      note=f"⌈{train} ÷ {gen}⌉ = {rounds} rounds a step; steps per epoch = prompts ÷ {gen}",
                      help=f"use gen_batch_size ≥ {train} (verl's DAPO scripts use 3 × train_batch_size = {3 * train})")
    replicas = norm.rollout.replicas
    sequences = norm.rollout.sequences_per_generation.value
    if replicas.exact and replicas.value and sequences % replicas.value:
        step = replicas.value // gcd(replicas.value, norm.rollout_n)
        yield error("RL208", key,
                    f"gen_batch_size {gen} × rollout.n {norm.rollout_n} = {sequences} sequences do not split evenly "
                    f"over the {replicas.value} rollout replicas",
                    note=norm.rollout.sequences_per_replica.formula,
                    help=f"make gen_batch_size a multiple of {step} (e.g. {or_list(nearest_multiples(step, gen))})")
