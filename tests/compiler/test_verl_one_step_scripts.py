"""verl's own one-step off-policy scripts (`python3 -m verl.experimental.one_step_off_policy.main_ppo`), pasted as
overrides: rlconf accepts them and reads the rollout pool where verl's one-step main reads it (the top-level
`rollout.nnodes` / `rollout.n_gpus_per_node`, on top of the trainer's GPUs).

The overrides are volcengine/verl's at b178a3cd56f58b2d502255daba591e92833930a7, as bash hands them to verl (each
script run with `python3` printing its arguments; `$HOME` written `~`): tests/special_e2e/run_one_step_off_policy.sh
with its defaults (FSDP2, 8 GPUs) and verl/experimental/one_step_off_policy/shell/dapo_7b_math_fsdp2_64_64_ris.sh.

What differs is said, not silent: verl's one-step entry point composes one_step_off_ppo_trainer.yaml, whose defaults
(free_cache_engine False, checkpoint_engine.backend nccl, rollout_correction.bypass_mode True) are not those of
verl's trainer config that rlconf starts from, so a script that leaves them out draws RL363-RL365 here.
"""

from __future__ import annotations

from pathlib import Path

from rlconf.compile import compile_plan
from rlconf.diagnostics import Severity

E2E_FSDP2 = """
        data.train_files=~/data/gsm8k/train.parquet
        data.val_files=~/data/gsm8k/test.parquet
        data.prompt_key=prompt
        data.truncation=left
        data.max_prompt_length=1024
        data.max_response_length=2048
        data.train_batch_size=8
        actor_rollout_ref.rollout.n=3
        algorithm.adv_estimator=grpo
        algorithm.use_kl_in_reward=False
        algorithm.kl_ctrl.kl_coef=0.0
        actor_rollout_ref.hybrid_engine=False
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.actor.kl_loss_coef=0.0
        actor_rollout_ref.actor.clip_ratio_low=0.2
        actor_rollout_ref.actor.clip_ratio_high=0.28
        actor_rollout_ref.actor.clip_ratio_c=10.0
        actor_rollout_ref.model.path=~/models/Qwen/Qwen2.5-0.5B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.actor.optim.lr_warmup_steps=-1
        actor_rollout_ref.actor.optim.weight_decay=0.1
        actor_rollout_ref.actor.ppo_mini_batch_size=4
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.actor.loss_agg_mode=token-mean
        actor_rollout_ref.rollout.gpu_memory_utilization=0.80
        actor_rollout_ref.rollout.temperature=1.0
        actor_rollout_ref.rollout.top_p=1.0
        actor_rollout_ref.rollout.top_k=-1
        actor_rollout_ref.rollout.val_kwargs.temperature=1.0
        actor_rollout_ref.rollout.val_kwargs.top_p=0.7
        actor_rollout_ref.rollout.val_kwargs.top_k=-1
        actor_rollout_ref.rollout.val_kwargs.do_sample=True
        actor_rollout_ref.rollout.val_kwargs.n=1
        actor_rollout_ref.rollout.enable_chunked_prefill=True
        actor_rollout_ref.rollout.name=vllm
        reward_model.reward_manager=dapo
        +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True
        +reward_model.reward_kwargs.overlong_buffer_cfg.len=128
        +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
        +reward_model.reward_kwargs.overlong_buffer_cfg.log=False
        +reward_model.reward_kwargs.max_resp_len=2048
        trainer.logger=[console]
        trainer.project_name=verl-test
        trainer.experiment_name=qwen2.5-0.5b-instruct-one-step-off-policy-fsdp2-minimal
        trainer.val_before_train=True
        trainer.test_freq=-1
        trainer.save_freq=-1
        trainer.total_epochs=2
        trainer.total_training_steps=2
        trainer.resume_mode=disable
        trainer.nnodes=1
        trainer.n_gpus_per_node=6
        rollout.nnodes=1
        rollout.n_gpus_per_node=2
        actor_rollout_ref.actor.strategy=fsdp2
        critic.strategy=fsdp2
        actor_rollout_ref.actor.grad_clip=1.0
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.use_dynamic_bsz=True
        actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
        actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.actor.ulysses_sequence_parallel_size=2
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.ref.fsdp_config.param_offload=True
        actor_rollout_ref.ref.ulysses_sequence_parallel_size=2
        actor_rollout_ref.actor.fsdp_config.fsdp_size=2
"""

DAPO_64_64_RIS = """
        data.train_files=~/verl/data/dapo-math-17k.parquet
        data.val_files=~/verl/data/aime-2024.parquet
        data.prompt_key=prompt
        data.truncation=left
        data.max_prompt_length=2048
        data.max_response_length=28672
        data.train_batch_size=512
        actor_rollout_ref.rollout.n=16
        algorithm.adv_estimator=grpo
        algorithm.use_kl_in_reward=False
        algorithm.kl_ctrl.kl_coef=0.0
        actor_rollout_ref.actor.strategy=fsdp2
        critic.strategy=fsdp2
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.actor.kl_loss_coef=0.0
        actor_rollout_ref.actor.clip_ratio_low=0.2
        actor_rollout_ref.actor.clip_ratio_high=0.28
        actor_rollout_ref.actor.clip_ratio_c=10.0
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.hybrid_engine=False
        +actor_rollout_ref.model.override_config.max_position_embeddings=32768
        actor_rollout_ref.actor.use_dynamic_bsz=True
        actor_rollout_ref.ref.log_prob_use_dynamic_bsz=True
        actor_rollout_ref.rollout.log_prob_use_dynamic_bsz=True
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu=61440
        actor_rollout_ref.ref.log_prob_max_token_len_per_gpu=92160
        actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=92160
        actor_rollout_ref.model.path=~/verl/models/Qwen2.5-Math-7B
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.actor.optim.lr_warmup_steps=10
        actor_rollout_ref.actor.optim.weight_decay=0.1
        actor_rollout_ref.actor.ppo_mini_batch_size=32
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.actor.grad_clip=1.0
        actor_rollout_ref.actor.loss_agg_mode=token-mean
        actor_rollout_ref.actor.ulysses_sequence_parallel_size=4
        actor_rollout_ref.rollout.gpu_memory_utilization=0.80
        actor_rollout_ref.rollout.tensor_model_parallel_size=4
        actor_rollout_ref.rollout.enable_chunked_prefill=True
        actor_rollout_ref.rollout.max_num_batched_tokens=30720
        actor_rollout_ref.rollout.temperature=1.0
        actor_rollout_ref.rollout.top_p=1.0
        actor_rollout_ref.rollout.top_k=-1
        actor_rollout_ref.rollout.val_kwargs.temperature=1.0
        actor_rollout_ref.rollout.val_kwargs.top_p=0.7
        actor_rollout_ref.rollout.val_kwargs.top_k=-1
        actor_rollout_ref.rollout.val_kwargs.do_sample=True
        actor_rollout_ref.rollout.val_kwargs.n=1
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.ref.fsdp_config.param_offload=True
        actor_rollout_ref.ref.ulysses_sequence_parallel_size=4
        actor_rollout_ref.actor.fsdp_config.fsdp_size=8
        reward_model.reward_manager=dapo
        +reward_model.reward_kwargs.overlong_buffer_cfg.enable=True
        +reward_model.reward_kwargs.overlong_buffer_cfg.len=4096
        +reward_model.reward_kwargs.overlong_buffer_cfg.penalty_factor=1.0
        +reward_model.reward_kwargs.overlong_buffer_cfg.log=False
        +reward_model.reward_kwargs.max_resp_len=28672
        trainer.logger=[console,tensorboard]
        trainer.project_name=DAPO
        trainer.experiment_name=dapo_qwen2-7B-math_28k_fsdp2_one_step_off_64-64-ris
        trainer.val_before_train=True
        trainer.test_freq=10
        trainer.save_freq=-1
        trainer.total_epochs=10
        trainer.total_training_steps=400
        trainer.default_local_dir=~/verl/ckpts/DAPO/dapo_qwen2-7B-math_28k_fsdp2_one_step_off_64-64-ris
        trainer.resume_mode=auto
        trainer.nnodes=8
        trainer.n_gpus_per_node=8
        rollout.nnodes=8
        rollout.n_gpus_per_node=8
        algorithm.rollout_correction.rollout_is=null
        algorithm.rollout_correction.rollout_is_threshold=null
        algorithm.rollout_correction.rollout_rs=seq_mean_k1
        algorithm.rollout_correction.rollout_rs_threshold=0.999_1.001
        algorithm.rollout_correction.bypass_mode=false
"""

RECIPE_DEFAULTS = ["actor_rollout_ref.rollout.free_cache_engine=false",
                   "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
                   "algorithm.rollout_correction.bypass_mode=true"]


def _compile(tmp_path: Path, text: str, extra: list[str] = ()):
    plan = tmp_path / "plan.yaml"
    plan.write_text("{}\n")
    result = compile_plan(plan, [line.strip() for line in text.strip().splitlines()] + list(extra))
    errors = [f"{d.code} {d.message}" for d in result.diagnostics if d.severity == Severity.ERROR]
    assert result.resolved is not None and not errors, errors
    # The off-policy rules' warnings (RL36x); others, such as RL610 for a model whose shape rlconf's table lacks, are
    # not about the schedule.
    return result.resolved, sorted({d.code for d in result.diagnostics
                                    if d.severity == Severity.WARNING and d.code.startswith("RL36")})


def test_verls_one_step_e2e_script_is_accepted_and_says_which_recipe_defaults_it_leaves_out(tmp_path):
    resolved, warnings = _compile(tmp_path, E2E_FSDP2)
    schedule = resolved.schedule
    assert (schedule.mode, schedule.trainer_gpus, schedule.rollout_gpus, schedule.weight_sync) == (
        "one_step_off_policy", 6, 2, "nccl")
    assert resolved.roles.rollout.old_log_probs == "recompute"  # rlconf's default: verl's recipe would bypass
    assert warnings == ["RL363", "RL364", "RL365"]
    # Written out, the recipe's defaults leave nothing to warn about and π_old is the rollout's, as in verl.
    resolved, warnings = _compile(tmp_path, E2E_FSDP2, RECIPE_DEFAULTS)
    assert warnings == [] and resolved.roles.rollout.old_log_probs == "rollout"


def test_verls_one_step_rejection_sampling_script_with_a_null_is_threshold_is_accepted(tmp_path):
    resolved, warnings = _compile(tmp_path, DAPO_64_64_RIS)
    assert (resolved.schedule.trainer_gpus, resolved.schedule.rollout_gpus) == (64, 64)
    correction = resolved.config.algorithm.rollout_correction
    assert correction.rollout_is is None and correction.rollout_is_threshold is None
    assert correction.rollout_rs == "seq_mean_k1"
    # rejection sampling corrects the staleness: no RL365; the two recipe defaults the script leaves out still warn
    assert warnings == ["RL363", "RL364"]
