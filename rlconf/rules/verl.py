"""verl values this engine does not run (RL108 / RL109), and the checks verl makes that a plan
pasted from verl must also pass here (RL518-RL521), and what verl does silently (RL525)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.lora_adapter import actor_lora
from rlconf.schema import PlanConfig
from rlconf.schema.sections import RolloutRsError
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
    correction = plan.algorithm.rollout_correction
    if correction.bypass_mode and actor.policy_loss.loss_mode != "vanilla":
        # verl's trainer swaps the loss mode for its bypass loss without a word.
        yield warning("RL525", "actor_rollout_ref.actor.policy_loss.loss_mode",
                      f"loss_mode {actor.policy_loss.loss_mode} has no effect in bypass mode: the loss is "
                      f"rollout_correction.loss_type {correction.loss_type} (PPO clip against the rollout policy, or "
                      "REINFORCE with IS weights), as in verl",
                      help="remove loss_mode, or set algorithm.rollout_correction.bypass_mode: false to train with it")
    if correction.rollout_is is not None and correction.rollout_is_threshold is None:
        # verl's compute_rollout_correction_and_rejection_mask weighs only when both are set: it would train unweighted.
        yield error("RL552", "algorithm.rollout_correction.rollout_is_threshold",
                    f"rollout_is is {correction.rollout_is}, but rollout_is_threshold is null: verl then computes no "
                    "importance weights at all (it weighs only when both are set), so the run would not correct "
                    "what rollout_is asks it to",
                    help="set rollout_is_threshold (verl's default 2.0), or rollout_is: null to train without weights")
    if correction.rollout_rs is not None:
        try:
            correction.rejection_checks()
        except RolloutRsError as exc:  # verl raises the same at its first step
            yield error("RL550", f"algorithm.rollout_correction.{exc.key}", str(exc),
                        help="e.g. rollout_rs: token_k1,seq_max_k2 with rollout_rs_threshold: 0.6_1.6,2.5 (k1: "
                             "lower_upper ratio bounds; k2/k3: one upper bound)")
    yield from check_overlong_buffer(plan)
    yield from check_batch_manager(plan)
    yield from check_lora_adapter(plan)


def check_batch_manager(plan: PlanConfig) -> Iterator[Diagnostic]:
    """verl's batch manager calls its scorer with the whole batch (data_sources=, solution_strs=, ...), and with no
    custom_reward_function it is handed the per-response default scorer, which fails on those arguments at the first
    step. A reward model's scores make the scorer unused."""
    reward = plan.reward_model
    if reward.reward_manager == "batch" and not plan.custom_reward_function.path and not reward.enable:
        yield error("RL533", "reward_model.reward_manager",
                    "reward_manager batch calls custom_reward_function once with the whole batch "
                    "(data_sources, solution_strs, ground_truths, extra_infos), and custom_reward_function.path is not "
                    "set: the built-in scorers take one response at a time (verl fails on its first step)",
                    help="set custom_reward_function.path (and .name) to a function of the whole batch that returns one "
                         "score per response, or use reward_manager naive or prime with the built-in scorers")


def check_overlong_buffer(plan: PlanConfig) -> Iterator[Diagnostic]:
    """DAPO's overlong buffer: verl's dapo manager asserts max_resp_len is given and not below the buffer, and
    its other managers do not take the argument at all (a TypeError at start)."""
    reward = plan.reward_model
    cfg, max_len = reward.reward_kwargs.overlong_buffer_cfg, reward.reward_kwargs.max_resp_len
    if cfg is None:
        return
    key = "reward_model.reward_kwargs.overlong_buffer_cfg"
    if reward.reward_manager != "dapo":
        yield error("RL521", key, f"overlong_buffer_cfg is an argument of the dapo reward manager, and reward_manager is "
                                  f"{reward.reward_manager} (verl's {reward.reward_manager} manager does not take it)",
                    help="set reward_model.reward_manager: dapo, or remove reward_kwargs.overlong_buffer_cfg")
    elif cfg.enable and max_len is None:
        yield error("RL521", key, "the overlong buffer ends at reward_kwargs.max_resp_len, which is not set (verl asserts it)",
                    help=f"set reward_model.reward_kwargs.max_resp_len (usually data.max_response_length, "
                         f"{plan.data.max_response_length})")
    elif cfg.enable and max_len is not None and max_len < cfg.len:
        yield error("RL521", "reward_model.reward_kwargs.max_resp_len",
                    f"max_resp_len {max_len} is shorter than the overlong buffer ({cfg.len} tokens; verl asserts it is not)",
                    help="make overlong_buffer_cfg.len at most max_resp_len")


def _as_set(value: object) -> object:
    """A list of module names compares as a set (peft matches them in any order); anything else as it is."""
    return frozenset(value) if isinstance(value, list) else value


def check_lora_adapter(plan: PlanConfig) -> Iterator[Diagnostic]:
    """A saved adapter's own config decides rank, alpha and targets (peft's from_pretrained, as verl loads it):
    say when the plan's keys say otherwise, or when the compiler could not read the adapter's config."""
    model = plan.actor_rollout_ref.model
    if model.lora_adapter_path is None:
        return
    key = "actor_rollout_ref.model.lora_adapter_path"
    lora = actor_lora(model)
    if lora is None or lora.source == "assumed":
        yield warning("RL551", key, f"{model.lora_adapter_path!r} is not a local directory with adapter_config.json: "
                                    f"the memory estimate assumes lora_rank {model.lora_rank} and target_modules "
                                    f"{model.target_modules!r}; the run takes rank, alpha and target modules from the "
                                    "adapter it loads", help="point lora_adapter_path at the adapter's local directory")
        return
    differ = [f"{name} {ours!r} (the adapter's: {theirs!r})" for name, ours, theirs, default in (
        ("lora_rank", model.lora_rank, lora.rank, 0), ("lora_alpha", model.lora_alpha, lora.alpha, 16),
        ("target_modules", model.target_modules, lora.target_modules, "all-linear"))
        if ours != default and _as_set(ours) != _as_set(theirs)]
    if differ:
        yield warning("RL551", key, f"the saved adapter's config ({lora.source}) decides LoRA's shape, as peft loads "
                                    f"it in verl: {', '.join(differ)} have no effect",
                      help="remove them, or leave lora_adapter_path null for a fresh adapter of that shape")
