"""What this engine can run: plans it must refuse (with the fix), and knobs it does not apply yet.

Every key of the schema is honoured by the engine or answered here before a worker starts: a
setting that would change the numbers, or that the memory estimate (and warning RL609) counts on,
is refused; a speed-only knob the engine does not apply is listed in a note at launch.
"""

from __future__ import annotations

import importlib.util
import json
from typing import Any

from engine.checkpoint import checkpoint_problems
from engine.loggers import logger_problems
from engine.models.liger import liger_problems
from engine.problems import MachineShortfall
from rlconf.lora_adapter import actor_lora
from rlconf.loss_head import loss_head_kernels
from rlconf.resolved import ResolvedPlan
from rlconf.schema.verl_compat import NOT_RUN_VALUES

ADVANTAGE_ESTIMATORS = {"gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "opo", "grpo_passk",
                        "gpg", "rloo_vectorized", "grpo_vectorized", "remax", "optimal_token_baseline",
                        "tir_optimal_token_baseline"}

# (dotted key, why it matters). Refused when set: the memory estimate subtracts these, or they change results.
# Empty for now: FSDP parameter/optimizer offload and activation offload are applied (engine/workers/fsdp/offload.py).
NOT_APPLIED_REFUSED: tuple[tuple[str, str], ...] = ()
# Speed- or memory-only knobs: the run computes the same numbers without them.
# Applied, so not listed: model.use_fused_kernels (engine/workers/sequence/fused_head.py),
# model.fused_kernel_options.impl_backend (triton: engine/workers/sequence/triton_head.py, CUDA only), model.use_liger
# (CUDA only, refused elsewhere: engine/models/liger.py), actor.use_torch_compile (on CUDA: the loss head's
# Triton kernels, rlconf.loss_head; on CPU the eager head).
NOT_APPLIED_NOTED = (
    "data.dataloader_num_workers",
    "data.return_raw_chat",
)
# Knobs with nothing to act on in this engine (nor in verl): a note at launch says why.
NO_EFFECT: dict[str, str] = {
    key: "the reference policy computes no entropy (as in verl), and its log-probs are computed outside "
         "autograd (in chunks by the eager head, in one pass by the Triton one) whatever this says"
    for key in ("actor_rollout_ref.ref.entropy_from_logits_with_chunking", "actor_rollout_ref.ref.entropy_checkpointing")
}

# Knobs the engine honours by other means than verl's: what runs instead, for docs/verl-compat.md.
RUNS_OTHERWISE: dict[str, str] = {
    "actor_rollout_ref.actor.use_torch_compile": "on CUDA the loss head runs rlconf's Triton kernels, not torch.compile "
                                                 "(the same math, faster, less memory, nothing to compile: "
                                                 "rlconf/loss_head.py); on CPU the eager head",
}


def setting(config: Any, dotted: str) -> tuple[Any, Any]:
    """(value, schema default) of a dotted key of the plan."""
    parent, value = None, config
    for part in dotted.split("."):
        parent, value = value, getattr(value, part)
    default = type(parent).model_fields[dotted.rsplit(".", 1)[-1]].get_default(call_default_factory=True)
    return value, default


def not_applied(resolved: ResolvedPlan, entries: Any) -> list[tuple[str, Any, Any, str]]:
    """(key, value, default, why) of the listed keys the plan moved off their default (critic keys: GAE plans only)."""
    out = []
    for entry in entries:
        key, why = entry if isinstance(entry, tuple) else (entry, "speed only")
        if key.startswith("critic.") and resolved.roles.critic is None:
            continue
        value, default = setting(resolved.config, key)
        if value != default:
            out.append((key, value, default, why))
    return out


def ignored_knob_notes(resolved: ResolvedPlan) -> list[str]:
    """Launch notes for speed-only knobs the plan sets and this engine does not apply yet."""
    notes = [f"{key}={json.dumps(value)} is not applied by this engine yet (speed or memory only: the numbers are the same)"
             for key, value, _default, _why in not_applied(resolved, NOT_APPLIED_NOTED)]
    notes += [f"{key}={json.dumps(value)} has no effect: {why}"
              for key, value, _default, why in not_applied(resolved, NO_EFFECT.items())]
    return notes


def peft_importable() -> bool:
    return importlib.util.find_spec("peft") is not None


def vllm_importable() -> bool:
    return importlib.util.find_spec("vllm") is not None


def rollout_problems(resolved: ResolvedPlan, vllm_found: Any = None) -> list[str]:
    """The rollout backend the plan names must exist here and suit its settings (`vllm_found`: for tests)."""
    plan = resolved.config
    rollout = plan.actor_rollout_ref.rollout
    problems = []
    if rollout.name == "vllm" and plan.trainer.device == "cpu":
        problems.append("rollout.name=vllm needs a GPU; use actor_rollout_ref.rollout.name=hf on CPU")
    elif rollout.name == "vllm" and not (vllm_found or vllm_importable)():
        problems.append(MachineShortfall("rollout.name=vllm, but vLLM is not installed in this Python; install it "
                                         "with `pip install 'rlconf[vllm]'` (a vLLM build that matches your torch), "
                                         "or use actor_rollout_ref.rollout.name=hf"))
    if rollout.name == "hf":
        if resolved.roles.rollout.tensor_parallel_size != 1:
            problems.append("rollout.tensor_model_parallel_size > 1 needs rollout.name=vllm (HF generate runs one "
                            "full copy per rank); set it to 1 or use vLLM")
        if rollout.engine_kwargs.vllm:
            problems.append(f"rollout.engine_kwargs.vllm={json.dumps(rollout.engine_kwargs.vllm)} go to vLLM, and "
                            "rollout.name=hf does not take them; remove them or use rollout.name=vllm")
    return problems


def lora_problems(resolved: ResolvedPlan, peft_found: Any = None) -> list[str]:
    """A LoRA plan (model.lora_rank > 0) needs peft here, and a reference that can run on the actor's model
    (`peft_found`: for tests)."""
    arr = resolved.config.actor_rollout_ref
    if actor_lora(arr.model) is None:
        return []
    problems = []
    if not (peft_found or peft_importable)():
        asked = (f"lora_adapter_path={arr.model.lora_adapter_path}" if arr.model.lora_adapter_path is not None
                 else f"lora_rank={arr.model.lora_rank}")
        problems.append(MachineShortfall(
            f"actor_rollout_ref.model.{asked} trains LoRA adapters with peft, which is not "
            "installed in this Python; install it with `pip install 'rlconf[lora]'` (or `pip install peft`), or set "
            "lora_rank to 0 (and lora_adapter_path to null) for full fine-tuning"))
    ref, actor = resolved.roles.ref, resolved.roles.actor
    if ref is not None and ref.sp_size != actor.sp_size:
        problems.append(f"with LoRA the reference log-probs come from the actor's own model (adapters off), which runs "
                        f"Ulysses over {actor.sp_size} rank(s); set actor_rollout_ref.ref.ulysses_sequence_parallel_size="
                        f"{actor.sp_size} (it is {ref.sp_size})")
    return problems


def fused_kernel_problems(resolved: ResolvedPlan) -> list[str]:
    """model.use_fused_kernels (engine/workers/sequence/fused_head.py) runs on whole packed or padded rows (the
    head of a Ulysses rank sees a slice of the row, whose next tokens live on another rank), on a
    plain linear head."""
    model = resolved.config.actor_rollout_ref.model
    if not model.use_fused_kernels:
        return []
    problems = []
    sp = {name: role.sp_size for name, role in (("actor", resolved.roles.actor), ("ref", resolved.roles.ref))
          if role is not None and role.sp_size > 1}
    if sp:
        problems.append(f"actor_rollout_ref.model.use_fused_kernels=true with Ulysses sequence parallelism "
                        f"({', '.join(f'{name} over {size} ranks' for name, size in sp.items())}) is not implemented; "
                        f"set use_fused_kernels to false or ulysses_sequence_parallel_size to 1")
    # The fused head multiplies by the head's own weight; an adapter on it would be left out.
    lora = actor_lora(model)  # a saved adapter's own targets when it starts from one
    targets = [] if lora is None else [lora.target_modules] if isinstance(lora.target_modules, str) else lora.target_modules
    if "lm_head" in targets:
        problems.append("actor_rollout_ref.model.use_fused_kernels=true with a LoRA adapter on lm_head is not "
                        "implemented; set use_fused_kernels to false or leave lm_head out of target_modules")
    return problems


def triton_importable() -> bool:
    return importlib.util.find_spec("triton") is not None


def triton_head_problems(impl_backend: str, device: str, triton_found: Any = None, *,
                         use_torch_compile: bool, use_fused_kernels: bool) -> list[str]:
    """Why the loss head's Triton kernels (engine/workers/sequence/triton_head.py), when the plan runs them
    (rlconf.loss_head: impl_backend=triton, or use_torch_compile on CUDA), cannot run here (empty: they can).
    `triton_found`: for tests."""
    if loss_head_kernels(impl_backend, use_torch_compile, use_fused_kernels, device) != "triton":
        return []
    asked = impl_backend == "triton"
    key = ("actor_rollout_ref.model.fused_kernel_options.impl_backend=triton" if asked
           else "actor_rollout_ref.actor.use_torch_compile=true (on CUDA: the loss head's Triton kernels)")
    fix = "set impl_backend to torch" if asked else "set actor_rollout_ref.actor.use_torch_compile=false"
    if device != "cuda":
        return [f"{key} needs CUDA (Triton compiles GPU kernels), and trainer.device={device}; {fix} on this device"]
    if not (triton_found or triton_importable)():
        return [MachineShortfall(f"{key}, but Triton is not installed in this Python (CUDA builds of torch ship it); "
                                 f"install triton or {fix}")]
    return []


def served_reward_model_problems(resolved: ResolvedPlan, vllm_found: Any = None) -> list[str]:
    """A reward model served by a rollout engine (verl 0.9.1's reward loop, rlconf.reward_loop) runs as a
    discriminative model on vLLM, one GPU per replica (engine/workers/roles/served_reward_model.py); what else
    verl's reward loop does is refused here (`vllm_found`: for tests)."""
    served = resolved.roles.served_reward_model
    if served is None:
        return []
    plan = resolved.config
    fsdp = ("or score with the FSDP reward-model worker (reward_model.use_reward_loop=false, with "
            "reward_model.micro_batch_size_per_gpu or use_dynamic_bsz)")
    problems: list[str] = []
    if served.backend != "vllm":
        problems.append(f"reward_model.rollout.name={served.backend}: this engine serves the reward model with vLLM "
                        f"only; set reward_model.rollout.name=vllm, {fsdp}")
    if served.tensor_parallel_size != 1:
        problems.append(f"reward_model.rollout.tensor_model_parallel_size={served.tensor_parallel_size}: this engine "
                        f"serves the reward model with one GPU per replica (tensor parallel size 1) so far; set "
                        f"reward_model.rollout.tensor_model_parallel_size=1 ({served.world_size} replica(s) on pool "
                        f"`{served.pool}`), {fsdp}")
    if served.colocated and resolved.schedule.off_policy:
        # The memory estimate counts a colocated served model beside the actor's rollout engine, which these modes
        # move to a pool of their own; where it would wake beside the trainer's states is neither estimated nor run.
        problems.append(f"a served reward model colocated on pool `{served.pool}` with the rollout on a pool of its own "
                        f"({resolved.schedule.mode}) is not run yet; give the reward model its own pool "
                        f"(reward_model.enable_resource_pool=true with reward_model.nnodes / n_gpus_per_node), {fsdp}")
    if plan.custom_reward_function.path:
        problems.append(f"custom_reward_function.path={plan.custom_reward_function.path} beside a served reward model: "
                        "verl's reward loop then calls that function instead of the reward model, and the function "
                        "reaches the model over HTTP (reward_router_address: a generative judge, or rules mixed with "
                        "model scores), which this engine does not run; remove custom_reward_function to score with "
                        f"the served reward model alone, {fsdp} (its scores are the reward)")
    if served.backend == "vllm" and plan.trainer.device == "cpu":
        problems.append("reward_model.rollout.name=vllm serves the reward model with vLLM, which needs a GPU "
                        "(trainer.device=cpu); on CPU score with the FSDP reward-model worker "
                        "(reward_model.use_reward_loop=false)")
    elif served.backend == "vllm" and not (vllm_found or vllm_importable)():
        problems.append(MachineShortfall("reward_model.rollout.name=vllm, but vLLM is not installed in this Python; "
                                         "install it with `pip install 'rlconf[vllm]'` (a vLLM build that matches "
                                         f"your torch), {fsdp}"))
    return problems


def verl_values_not_run(resolved: ResolvedPlan) -> list[str]:
    """verl values the plan names that this engine does not run (the compiler's RL108; checked again here)."""
    problems = []
    for key, values in NOT_RUN_VALUES.items():
        value = setting(resolved.config, key)[0]
        for item in value if isinstance(value, list) else [value]:
            not_run = values.get(item)
            if not_run is not None and not_run.refused:
                problems.append(f"{key}={json.dumps(item)}: verl runs {not_run.feature}, this engine does not yet "
                                f"({not_run.why}); use {not_run.instead}")
    return problems


def off_policy_problems(resolved: ResolvedPlan) -> list[str]:
    """What the one-step off-policy schedule (hybrid_engine false) does not run yet: each of these generates
    with the actor's own rollout copy in the middle of a step, which a rollout pool of its own does not have."""
    if not resolved.schedule.off_policy:
        return []
    plan = resolved.config
    off = "with actor_rollout_ref.hybrid_engine=false (one-step off-policy)"
    problems = []
    if plan.algorithm.filter_groups.enable:
        problems.append(f"algorithm.filter_groups.enable=true {off} is not implemented: dynamic sampling generates "
                        "more rounds inside a step; turn one of them off")
    if plan.algorithm.adv_estimator == "remax":
        problems.append(f"algorithm.adv_estimator=remax {off} is not implemented: its greedy baseline is generated by "
                        "the weights being trained; use grpo or rloo, or hybrid_engine=true")
    if actor_lora(plan.actor_rollout_ref.model) is not None:  # lora_rank > 0, or a saved adapter (lora_adapter_path)
        problems.append(f"LoRA (actor_rollout_ref.model.lora_rank > 0 or lora_adapter_path) {off} is not run yet "
                        "(the push would send the merged weights, as the colocated rollout gets them, but no test has "
                        "checked that path); train without LoRA or set hybrid_engine=true")
    return problems


def unsupported_features(resolved: ResolvedPlan) -> list[str]:
    """Why this plan cannot launch here, as messages for people (empty: runnable): what this engine does not
    run yet, and (as `MachineShortfall`) what this machine lacks."""
    plan = resolved.config
    arr = plan.actor_rollout_ref
    problems = verl_values_not_run(resolved)
    estimator = plan.algorithm.adv_estimator
    if estimator not in ADVANTAGE_ESTIMATORS and estimator not in NOT_RUN_VALUES["algorithm.adv_estimator"]:
        problems.append(f"algorithm.adv_estimator={plan.algorithm.adv_estimator}: the engine runs "
                        f"{', '.join(sorted(ADVANTAGE_ESTIMATORS))} so far")
    if estimator in ("optimal_token_baseline", "tir_optimal_token_baseline") and \
            resolved.roles.rollout.old_log_probs == "rollout":
        problems.append(f"algorithm.adv_estimator={estimator} weights tokens by Σπ² from the old-log-prob pass, "
                        "which bypass mode (algorithm.rollout_correction.bypass_mode) skips; turn bypass_mode off "
                        "or use grpo")
    # The actor worker runs ref in its own processes, and rollout too unless hybrid_engine is off (off-policy).
    actor_pool = resolved.placement.roles["actor"]
    roles_apart = ("ref",) if resolved.schedule.off_policy else ("rollout", "ref")
    apart = [role for role in roles_apart if resolved.placement.roles.get(role, actor_pool) != actor_pool]
    problems.extend(off_policy_problems(resolved))
    if apart:
        problems.append(f"placement: {' and '.join(apart)} on a pool other than the actor's (`{actor_pool}`) is not "
                        f"implemented; place {' and '.join(apart)} on `{actor_pool}` (the critic may have its own pool)")
    critic = resolved.roles.critic
    critic_tokenizer = plan.critic.model.tokenizer_path
    if critic is not None and critic_tokenizer and critic_tokenizer != (arr.model.tokenizer_path or arr.model.path):
        problems.append(f"critic.model.tokenizer_path={critic_tokenizer}: the critic reads the actor's token ids; "
                        f"a critic with its own tokenizer is not implemented (leave tokenizer_path unset)")
    problems.extend(rollout_problems(resolved))
    problems.extend(lora_problems(resolved))
    problems.extend(served_reward_model_problems(resolved))
    problems.extend(fused_kernel_problems(resolved))
    problems.extend(liger_problems(arr.model.use_liger, plan.trainer.device))
    problems.extend(triton_head_problems(arr.model.fused_kernel_options.impl_backend, plan.trainer.device,
                                         use_torch_compile=arr.actor.use_torch_compile,
                                         use_fused_kernels=arr.model.use_fused_kernels))
    # Ulysses sequence parallelism (actor, ref, critic) runs: engine/workers/sequence/ulysses.py. Its packing
    # requirement is the compiler's rule RL306.
    problems.extend(f"{key}={json.dumps(value)} is not applied by this engine yet ({why}); set it to {json.dumps(default)}"
                    for key, value, default, why in not_applied(resolved, NOT_APPLIED_REFUSED))
    problems.extend(logger_problems(plan.trainer.logger))
    problems.extend(checkpoint_problems(resolved))
    return problems
