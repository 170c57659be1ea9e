"""Algorithm and engine-compatibility rules (RL5xx)."""

from __future__ import annotations

from collections.abc import Iterator

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.loss_head import plan_loss_head_kernels
from rlconf.modelinfo import RANDOM_PREFIX, RANDOM_TWINS, ModelInfo, random_shape
from rlconf.normalize import Normalized, is_group_estimator
from rlconf.schema import PlanConfig

RESUME_MODES = ("auto", "disable", "resume_path")


# What verl 0.9.1 does with a group of one response, per group estimator (trainer/ppo/core_algos.py: grpo L315-317,
# rloo L622-631, opo L678, gpg L817, reinforce_plus_plus_baseline L572, the token baselines L950 and L1085; grpo_vectorized
# in utils/groupwise.py group_mean_std; grpo_passk L516-519; rloo_vectorized L864). Most run:
# the group baseline falls back to 0, so the advantage is the reward itself (REINFORCE without a baseline).
ONE_SAMPLE_RUNS: dict[str, str] = {
    "grpo": "each group is one sample, whose mean is taken as 0 and std as 1: the advantage is the raw reward, "
            "REINFORCE without a baseline",
    "grpo_vectorized": "each group is one sample, whose mean is taken as 0 and std as 1: the advantage is the raw "
                       "reward, REINFORCE without a baseline",
    "rloo": "each group is one sample with no other to leave out: the advantage is the raw reward, REINFORCE "
            "without a baseline",
    "opo": "each group is one sample, whose baseline is taken as 0: the advantage is the raw reward, REINFORCE "
           "without a baseline",
    "gpg": "each group is one sample, whose mean is taken as 0: the advantage is the raw reward scaled by GPG's "
           "α / f_norm",
    "reinforce_plus_plus_baseline": "each group is one sample, whose mean is taken as 0: the raw rewards are "
                                    "whitened over the batch, as reinforce_plus_plus does",
    "optimal_token_baseline": "each group is one sample, which gets no baseline: the advantage is the raw "
                              "reward-to-go",
    "tir_optimal_token_baseline": "each group is one sample, which gets no baseline: the advantage is the raw "
                                  "reward-to-go",
}
# ... and where verl's run fails, or trains on nothing.
ONE_SAMPLE_FAILS: dict[str, str] = {
    "grpo_passk": "verl raises at the first step: Pass@k needs a best and a second-best response per prompt",
    "rloo_vectorized": "verl gives every group of one an advantage of 0: the policy gradient is zero and the run "
                       "learns nothing from its rewards",
}


def _one_sample_per_group(estimator: str) -> Iterator[Diagnostic]:
    """rollout.n = 1 with a group estimator: what verl does with groups of one, said as a warning where it runs."""
    if estimator in ONE_SAMPLE_FAILS:
        runs_alike = "rloo (the same for n ≥ 2)" if estimator == "rloo_vectorized" else "grpo"
        yield error("RL530", "actor_rollout_ref.rollout.n",
                    f"adv_estimator `{estimator}` with rollout.n 1: {ONE_SAMPLE_FAILS[estimator]}",
                    help=f"set actor_rollout_ref.rollout.n to at least 2, or use {runs_alike}")
        return
    yield warning("RL501", "actor_rollout_ref.rollout.n",
                  f"adv_estimator `{estimator}` with rollout.n 1: {ONE_SAMPLE_RUNS[estimator]}, as in verl",
                  help="set actor_rollout_ref.rollout.n to 4-16 for a group baseline, or keep n 1 for REINFORCE-style "
                       "updates on the raw reward")


def check_algorithm(plan: PlanConfig, norm: Normalized, model: ModelInfo | None) -> Iterator[Diagnostic]:
    arr, algo, trainer = plan.actor_rollout_ref, plan.algorithm, plan.trainer
    rollout = arr.rollout
    if is_group_estimator(plan) and rollout.n < 2:
        yield from _one_sample_per_group(algo.adv_estimator)
    if rollout.n > 1 and (not rollout.do_sample or rollout.temperature == 0):
        yield warning("RL505", "actor_rollout_ref.rollout.temperature" if rollout.do_sample else "actor_rollout_ref.rollout.do_sample",
                      f"rollout.n is {rollout.n} but sampling is greedy: the {rollout.n} responses to a prompt will be identical",
                      help="set do_sample: true and a temperature > 0 (1.0 is the usual)")
    if arr.actor.use_kl_loss and algo.use_kl_in_reward:
        yield warning("RL502", "algorithm.use_kl_in_reward", "KL is applied twice: as a loss term (actor.use_kl_loss) and in the reward",
                      help="GRPO usually uses the loss term only; PPO the in-reward penalty")
    if algo.kl_ctrl.type == "adaptive" and not algo.use_kl_in_reward:
        yield warning("RL508", "algorithm.kl_ctrl.type", "an adaptive KL controller has no effect without algorithm.use_kl_in_reward",
                      help="set use_kl_in_reward: true, or drop kl_ctrl")
    if trainer.critic_warmup and norm.critic is None:
        yield warning("RL503", "trainer.critic_warmup", f"critic_warmup {trainer.critic_warmup} has no effect: adv_estimator `{algo.adv_estimator}` uses no critic")
    for key in ("actor_rollout_ref.model.path", "critic.model.path"):
        path = arr.model.path if key.startswith("actor") else plan.critic.model.path
        if path and path.startswith(RANDOM_PREFIX) and random_shape(path) is None:
            yield error("RL517", key, f"`{path}` names no shape rlconf knows for a random-weight model",
                        help=f"use one of {', '.join(RANDOM_PREFIX + name for name in RANDOM_TWINS)}")
    if trainer.device == "cpu" and rollout.name == "vllm":
        yield error("RL509", "actor_rollout_ref.rollout.name", "rollout `vllm` needs CUDA GPUs but trainer.device is `cpu`",
                    help="use `rollout.name: hf` on CPU")
    # Liger's kernels are Triton (CUDA); `rlconf launch` refuses them on CPU (engine/models/liger.py).
    # use_fused_kernels is pure torch and runs on CPU too.
    if trainer.device == "cpu" and arr.model.use_liger:
        yield warning("RL511", "actor_rollout_ref.model.use_liger",
                      "Liger kernels need CUDA (Triton): `rlconf launch` refuses them with trainer.device `cpu`",
                      help="set `use_liger: false`")
    if arr.model.fused_kernel_options.impl_backend == "triton" and trainer.device == "cpu":
        yield warning("RL528", "actor_rollout_ref.model.fused_kernel_options.impl_backend",
                      "the Triton loss head needs CUDA: `rlconf launch` refuses impl_backend `triton` with "
                      "trainer.device `cpu`", help="set `impl_backend: torch`")
    if plan_loss_head_kernels(plan) == "triton":
        # The Triton head keeps no fp32 [tokens, vocab] tensor: there is nothing to chunk or recompute.
        chunking = [knob for knob, on in (("entropy_from_logits_with_chunking", arr.actor.entropy_from_logits_with_chunking),
                                          ("entropy_checkpointing", arr.actor.entropy_checkpointing)) if on]
        why = ("fused_kernel_options.impl_backend `triton`" if arr.model.fused_kernel_options.impl_backend == "triton"
               else "actor.use_torch_compile on CUDA, which runs the loss head in rlconf's Triton kernels")
        if chunking:
            yield warning("RL529", f"actor_rollout_ref.actor.{chunking[0]}",
                          f"{' and '.join(chunking)} {'has' if len(chunking) == 1 else 'have'} no effect with "
                          f"{why}: its kernels keep no fp32 [tokens, vocab] tensor to chunk or recompute",
                          help=f"drop {' and '.join(chunking)}")
    # torch.compile cannot trace Liger's Triton autograd functions, and Liger swaps the model family's RoPE
    # function for the whole process (seen on an H100: dynamo fails inside LigerRMSNormFunction).
    for section, compiled in (("actor_rollout_ref", arr.model.compile_layers),
                              ("critic", norm.critic is not None and plan.critic.model.compile_layers)):
        if compiled and arr.model.use_liger:
            yield error("RL526", f"{section}.model.compile_layers",
                        f"{section}.model.compile_layers and actor_rollout_ref.model.use_liger cannot run together: "
                        "torch.compile cannot trace Liger's kernels, and Liger patches RoPE for every model in the process",
                        help="keep one of them: compile_layers fuses the norms, RoPE and SwiGLU that Liger replaces")
    # Ulysses' all-to-all runs inside attention, an autograd.Function over a process group, which no run
    # has traced through torch.compile yet: refused until one does, rather than failing at the first step.
    compiled_roles = [(section, role) for section, role, compiled in (
        ("actor_rollout_ref", norm.actor, arr.model.compile_layers),
        ("actor_rollout_ref", norm.ref, arr.model.compile_layers),
        ("critic", norm.critic, norm.critic is not None and plan.critic.model.compile_layers)) if compiled and role]
    for section, role in compiled_roles:
        if role.sp_size > 1:
            yield error("RL527", f"{section}.model.compile_layers",
                        f"{section}.model.compile_layers with Ulysses sequence parallelism (the {role.role} runs "
                        f"sp {role.sp_size}) is not supported yet: no run has traced Ulysses' all-to-all "
                        "(inside attention) through torch.compile",
                        help="set compile_layers: false for a Ulysses plan")
            break
    yield from _log_probs_asked_off(plan, norm)
    model_len = norm.rollout.max_model_len.value
    seq_len = norm.rollout.prompt_length.value + norm.rollout.response_length.value
    if rollout.max_model_len is not None and model_len < seq_len:
        yield error("RL510", "actor_rollout_ref.rollout.max_model_len",
                    f"rollout max_model_len {model_len} is shorter than prompt + response = {seq_len}",
                    help=f"use at least {seq_len}, or leave it unset")
    if model is not None and model.max_position_embeddings and seq_len > model.max_position_embeddings:
        yield error("RL510", "data.max_response_length",
                    f"prompt + response = {seq_len} tokens exceeds the model's max_position_embeddings {model.max_position_embeddings}",
                    help="shorten data.max_prompt_length or data.max_response_length")
    if rollout.name == "vllm" and rollout.enable_chunked_prefill and rollout.max_num_batched_tokens < model_len:
        # verl 0.9.1 hands both to vLLM as they are, and vLLM's chunked prefill runs them (verl 0.4.1 raised here).
        yield warning("RL512", "actor_rollout_ref.rollout.max_num_batched_tokens",
                      f"max_num_batched_tokens {rollout.max_num_batched_tokens} is smaller than max_model_len {model_len}: "
                      "with chunked prefill vLLM splits a longer prompt's prefill over several engine steps",
                      help=f"raise it to at least {model_len} to prefill any prompt in one step")
    if rollout.val_kwargs.do_sample and rollout.val_kwargs.temperature == 0:
        yield warning("RL513", "actor_rollout_ref.rollout.val_kwargs.temperature", "validation sampling is on with temperature 0: it is greedy decoding",
                      help="set val_kwargs.temperature > 0 or do_sample: false")
    mode = trainer.resume_mode
    if mode == "resume_path" and not trainer.resume_from_path:
        yield error("RL514", "trainer.resume_from_path", "resume_mode `resume_path` needs trainer.resume_from_path",
                    help="set resume_from_path to a checkpoint directory (global_step_N)")
    elif mode not in RESUME_MODES and "/" not in mode and not mode.startswith("global_step"):
        yield error("RL514", "trainer.resume_mode", f"resume_mode `{mode}` is not auto, disable, resume_path or a checkpoint path",
                    help="use `auto` (latest checkpoint in default_local_dir), `disable`, or a path")
    if trainer.save_freq == 0 or trainer.test_freq == 0:
        key = "trainer.save_freq" if trainer.save_freq == 0 else "trainer.test_freq"
        yield error("RL103", key, f"`{key}` is 0; use -1 to turn it off or a positive number of steps")
    if (trainer.test_freq > 0 or trainer.val_before_train) and not plan.data.val_files:
        key = "trainer.test_freq" if trainer.test_freq > 0 else "trainer.val_before_train"
        yield error("RL516", key, f"`{key}` asks for validation but data.val_files is not set",
                    help="set data.val_files to validation parquet file(s) (`rlconf data synthetic DIR` writes a val.parquet), "
                         "or turn validation off (test_freq: -1, val_before_train: false)")
    if plan.custom_reward_function.path is None and plan.reward_model.enable is False and plan.data.reward_fn_key != "data_source":
        yield warning("RL515", "data.reward_fn_key",
                      f"reward_fn_key `{plan.data.reward_fn_key}` selects built-in scorers by a column other than data_source",
                      help="the built-in scorers are keyed by data_source values; make sure the column holds them")


def _log_probs_asked_off(plan: PlanConfig, norm: Normalized) -> Iterator[Diagnostic]:
    """rollout.calculate_log_probs false where the run reads the rollout's log-probs: rlconf returns them anyway
    (rlconf.normalize.rollout_log_prob_need), verl 0.9.1 does not. Its trainer then skips rollout_is and rollout_rs
    without a word (trainer/ppo/v1/trainer_base.py: `"rollout_log_probs" in data.batch`), raises in bypass mode
    (rollout_corr_helper.py) and asserts in the fully async rollouter."""
    rollout = plan.actor_rollout_ref.rollout
    fully_async = norm.schedule.mode == "fully_async"
    if rollout.calculate_log_probs or not (norm.rollout.log_probs or fully_async):
        return
    if not norm.rollout.log_probs:  # fully async, nothing reading them: rlconf runs it as asked
        yield warning("RL553", "actor_rollout_ref.rollout.calculate_log_probs",
                      "calculate_log_probs is false in a fully async run: rlconf samples without log-probs as asked; "
                      "verl 0.9.1's fully async rollouter asserts it is true",
                      help="set calculate_log_probs: true (verl's default) to run the plan in verl too")
        return
    in_verl = ("a fully async run asserts it" if fully_async else
               "bypass mode raises" if norm.rollout.old_log_probs == "rollout" else
               "its trainer skips the correction without a word")
    yield warning("RL553", "actor_rollout_ref.rollout.calculate_log_probs",
                  f"calculate_log_probs is false, but {norm.rollout.log_probs_why}: rlconf returns them anyway; in "
                  f"verl 0.9.1 {in_verl}",
                  help="set calculate_log_probs: true (verl's default), as the plan reads them")
