"""Nineteen of verl's own launch scripts, pasted as overrides the way a verl user would: each is accepted,
or refused only with RL108 naming a feature rlconf does not run yet; an accepted one resolves the
rollout replicas and per-GPU numbers verl computes for it.

The scripts are volcengine/verl's examples at b178a3cd56f58b2d502255daba591e92833930a7 that run
`python3 -m verl.trainer.main_ppo` with the default FSDP config (path below). Each override is one
line as the shell hands it to verl: the script's own variables substituted, `$HOME` written `~`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from verl_compare import assert_same_numbers, nest
from verl_reference import verl_normalize, verl_served_reward_model_replicas

from rlconf.compile import compile_plan
from rlconf.loader import parse_override


@dataclass(frozen=True)
class Script:
    path: str  # under examples/ of volcengine/verl at b178a3cd
    refused: list[str]  # the features RL108 names; empty: accepted
    text: str  # the overrides, one per line

    @property
    def overrides(self) -> list[str]:
        return [line.strip() for line in self.text.strip().splitlines()]


SCRIPTS = [
    Script("examples/grpo_trainer/run_qwen2-7b.sh", [], """
        algorithm.adv_estimator=grpo
        data.train_files=~/data/gsm8k/train.parquet
        data.val_files=~/data/gsm8k/test.parquet
        data.train_batch_size=1024
        data.max_prompt_length=512
        data.max_response_length=1024
        data.filter_overlong_prompts=True
        data.truncation=error
        actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.ppo_mini_batch_size=256
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40
        actor_rollout_ref.actor.use_kl_loss=True
        actor_rollout_ref.actor.kl_loss_coef=0.001
        actor_rollout_ref.actor.kl_loss_type=low_var_kl
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        actor_rollout_ref.rollout.n=5
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40
        actor_rollout_ref.ref.fsdp_config.param_offload=True
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_grpo_example_gsm8k
        trainer.experiment_name=qwen2_7b_function_rm
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=20
        trainer.test_freq=5
        trainer.total_epochs=15
    """),
    Script("examples/ppo_trainer/run_deepseek7b_llm.sh", [], """
        algorithm.adv_estimator=gae
        data.train_files=~/data/gsm8k/train.parquet
        data.val_files=~/data/gsm8k/test.parquet
        data.train_batch_size=1024
        data.max_prompt_length=512
        data.max_response_length=512
        data.filter_overlong_prompts=True
        data.truncation=error
        actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.ppo_mini_batch_size=256
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=32
        actor_rollout_ref.rollout.tensor_model_parallel_size=4
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.4
        critic.optim.lr=1e-5
        critic.model.use_remove_padding=True
        critic.model.path=deepseek-ai/deepseek-llm-7b-chat
        critic.model.enable_gradient_checkpointing=True
        critic.ppo_micro_batch_size_per_gpu=32
        critic.model.fsdp_config.param_offload=False
        critic.model.fsdp_config.optimizer_offload=False
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_example_gsm8k
        trainer.experiment_name=deepseek_llm_7b_function_rm
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=20
        trainer.test_freq=1
        trainer.use_legacy_worker_impl=auto
        trainer.total_epochs=15
    """),
    Script("examples/grpo_trainer/run_deepseek7b_llm_seq_balance.sh", [], """
        algorithm.adv_estimator=grpo
        data.train_files=~/data/gsm8k/train.parquet
        data.val_files=~/data/gsm8k/test.parquet
        data.train_batch_size=1024
        data.max_prompt_length=512
        data.max_response_length=512
        data.filter_overlong_prompts=True
        data.truncation=error
        actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.ppo_mini_batch_size=256
        actor_rollout_ref.actor.use_dynamic_bsz=True
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000
        actor_rollout_ref.actor.use_kl_loss=True
        actor_rollout_ref.actor.kl_loss_coef=0.001
        actor_rollout_ref.actor.kl_loss_type=low_var_kl
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        actor_rollout_ref.rollout.n=5
        actor_rollout_ref.ref.fsdp_config.param_offload=True
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_grpo_example_gsm8k
        trainer.experiment_name=deepseek_llm_7b_function_rm_seq_packing
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=20
        trainer.test_freq=5
        trainer.total_epochs=15
    """),
    Script("examples/ppo_trainer/run_deepseek7b_llm_sp2.sh", [], """
        algorithm.adv_estimator=gae
        data.train_files=~/data/gsm8k/train.parquet
        data.val_files=~/data/gsm8k/test.parquet
        data.train_batch_size=1024
        data.max_prompt_length=512
        data.max_response_length=512
        data.filter_overlong_prompts=True
        data.truncation=error
        actor_rollout_ref.model.path=deepseek-ai/deepseek-llm-7b-chat
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.ppo_mini_batch_size=256
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32
        actor_rollout_ref.actor.ulysses_sequence_parallel_size=2
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=64
        actor_rollout_ref.rollout.tensor_model_parallel_size=4
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        critic.optim.lr=1e-5
        critic.ulysses_sequence_parallel_size=2
        critic.model.use_remove_padding=True
        critic.model.path=deepseek-ai/deepseek-llm-7b-chat
        critic.model.enable_gradient_checkpointing=True
        critic.ppo_micro_batch_size_per_gpu=64
        critic.model.fsdp_config.param_offload=False
        critic.model.fsdp_config.optimizer_offload=False
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_example_gsm8k
        trainer.experiment_name=deepseek_llm_7b_function_rm_sp2
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=20
        trainer.test_freq=5
        trainer.total_epochs=15
    """),
    Script("examples/rloo_trainer/run_qwen2-7b.sh", [], """
        algorithm.adv_estimator=rloo
        data.train_files=~/data/gsm8k/train.parquet
        data.val_files=~/data/gsm8k/test.parquet
        data.train_batch_size=1024
        data.max_prompt_length=512
        data.max_response_length=1024
        data.filter_overlong_prompts=True
        data.truncation=error
        actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.ppo_mini_batch_size=256
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=80
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=160
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        actor_rollout_ref.rollout.n=5
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=160
        actor_rollout_ref.ref.fsdp_config.param_offload=True
        algorithm.use_kl_in_reward=True
        algorithm.kl_penalty=kl
        algorithm.kl_ctrl.kl_coef=0.001
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_rloo_example_gsm8k
        trainer.experiment_name=qwen2_7b_function_rm
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=-1
        trainer.test_freq=5
        trainer.total_epochs=15
    """),
    Script("examples/reinforce_plus_plus_trainer/run_qwen2-7b_math_rf.sh", [], """
        algorithm.adv_estimator=reinforce_plus_plus
        data.train_files=['~/data/gsm8k/train.parquet', '~/data/math/train.parquet']
        data.val_files=['~/data/gsm8k/test.parquet', '~/data/math/test.parquet']
        data.train_batch_size=1024
        data.max_prompt_length=1024
        data.max_response_length=1024
        data.filter_overlong_prompts=True
        data.truncation=error
        actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
        actor_rollout_ref.actor.optim.lr=3e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.ppo_mini_batch_size=1024
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.actor.kl_loss_coef=0.001
        actor_rollout_ref.actor.kl_loss_type=mse
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        actor_rollout_ref.rollout.n=8
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
        actor_rollout_ref.ref.fsdp_config.param_offload=True
        algorithm.use_kl_in_reward=True
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_grpo_example_gsm8k
        trainer.experiment_name=qwen2_7b_function_rm
        trainer.n_gpus_per_node=16
        trainer.nnodes=1
        trainer.save_freq=-1
        trainer.test_freq=5
        trainer.total_epochs=15
    """),
    Script("examples/grpo_trainer/run_qwen2_5-3b_gsm8k_grpo_lora.sh", [], """
        algorithm.adv_estimator=grpo
        trainer.val_before_train=False
        data.train_files=~/data/gsm8k/train.parquet
        data.val_files=~/data/gsm8k/test.parquet
        data.train_batch_size=16
        data.max_prompt_length=512
        data.max_response_length=1024
        data.filter_overlong_prompts=True
        data.truncation=error
        data.shuffle=False
        actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct
        actor_rollout_ref.model.lora_rank=64
        actor_rollout_ref.model.lora_alpha=32
        actor_rollout_ref.actor.optim.lr=3e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.ppo_mini_batch_size=16
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=40
        actor_rollout_ref.actor.use_kl_loss=True
        actor_rollout_ref.actor.kl_loss_coef=0.001
        actor_rollout_ref.actor.kl_loss_type=low_var_kl
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=40
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        actor_rollout_ref.rollout.n=5
        actor_rollout_ref.rollout.load_format=safetensors
        actor_rollout_ref.rollout.layered_summon=True
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=40
        actor_rollout_ref.ref.fsdp_config.param_offload=True
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_grpo_example_gsm8k
        trainer.experiment_name=qwen2.5_3b_grpo_lora
        trainer.n_gpus_per_node=2
        trainer.nnodes=1
        trainer.save_freq=20
        trainer.test_freq=5
        trainer.total_epochs=15
    """),
    Script("examples/ppo_trainer/run_qwen2-7b_sglang_seq_balance.sh", ["SGLang rollout"], """
        algorithm.adv_estimator=gae
        data.train_files=['~/data/gsm8k/train.parquet', '~/data/math/train.parquet']
        data.val_files=['~/data/gsm8k/test.parquet', '~/data/math/test.parquet']
        data.train_batch_size=4096
        data.max_prompt_length=4096
        data.max_response_length=4096
        data.filter_overlong_prompts=True
        data.truncation=error
        actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.ppo_mini_batch_size=512
        actor_rollout_ref.actor.use_dynamic_bsz=True
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.rollout.name=sglang
        actor_rollout_ref.rollout.gpu_memory_utilization=0.5
        actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24000
        critic.optim.lr=1e-5
        critic.model.use_remove_padding=True
        critic.model.path=Qwen/Qwen2-7B-Instruct
        critic.model.enable_gradient_checkpointing=True
        critic.ppo_max_token_len_per_gpu=98304
        critic.model.fsdp_config.param_offload=False
        critic.model.fsdp_config.optimizer_offload=False
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_example_gsm8k
        trainer.experiment_name=qwen2-7b_function_rm_bsz8k_p4k_r4k_seq_packing
        trainer.n_gpus_per_node=8
        trainer.val_before_train=False
        trainer.nnodes=1
        trainer.save_freq=20
        trainer.test_freq=5
        trainer.total_epochs=15
    """),
    Script("examples/gpg_trainer/run_qwen2-7b_math.sh", [], """
        algorithm.adv_estimator=gpg
        data.train_files=['~/data/gsm8k/train.parquet', '~/data/math/train.parquet']
        data.val_files=['~/data/gsm8k/test.parquet', '~/data/math/test.parquet']
        data.train_batch_size=1024
        data.max_prompt_length=1024
        data.max_response_length=1024
        data.filter_overlong_prompts=True
        data.truncation=error
        actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.ppo_mini_batch_size=256
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.actor.policy_loss.loss_mode=gpg
        actor_rollout_ref.actor.kl_loss_coef=0.001
        actor_rollout_ref.actor.kl_loss_type=low_var_kl
        actor_rollout_ref.actor.entropy_coeff=0
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        actor_rollout_ref.rollout.n=5
        actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=16
        actor_rollout_ref.ref.fsdp_config.param_offload=True
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_gpg_example_gsm8k_math
        trainer.experiment_name=qwen2_7b_function_rm
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=20
        trainer.test_freq=5
        trainer.total_epochs=15
    """),
    Script("examples/remax_trainer/run_qwen2.5-3b_seq_balance.sh", [], """
        algorithm.adv_estimator=remax
        data.train_files=~/data/gsm8k/train.parquet
        data.val_files=~/data/gsm8k/test.parquet
        data.train_batch_size=512
        data.max_prompt_length=512
        data.max_response_length=1024
        data.filter_overlong_prompts=True
        data.truncation=error
        actor_rollout_ref.model.path=Qwen/Qwen2.5-3B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.ppo_mini_batch_size=128
        actor_rollout_ref.actor.use_dynamic_bsz=True
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu=30000
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.8
        actor_rollout_ref.rollout.n=4
        actor_rollout_ref.ref.fsdp_config.param_offload=True
        algorithm.use_kl_in_reward=True
        algorithm.kl_penalty=kl
        algorithm.kl_ctrl.kl_coef=0.001
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_remax_example_gsm8k
        trainer.experiment_name=qwen2.5_3b_function_rm_kl1e-3
        trainer.val_before_train=False
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=-1
        trainer.test_freq=5
        trainer.total_epochs=5
    """),
    # The reward-model scripts: verl 0.9.1's reward loop (a served reward model) and the legacy FSDP worker.
    Script("examples/grpo_trainer/run_mistral13b_skyworkrm_hhrlhf.sh", [], """
        algorithm.adv_estimator=grpo
        data.train_files=data/full_hh_rlhf/rl/train.parquet
        data.val_files=data/full_hh_rlhf/rl/train.parquet
        data.train_batch_size=512
        data.prompt_key=prompt
        data.return_raw_chat=True
        data.max_prompt_length=4096
        data.max_response_length=2048
        data.filter_overlong_prompts=True
        data.truncation=error
        actor_rollout_ref.model.path=mistralai/Mistral-Nemo-Instruct-2407
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.actor.ppo_mini_batch_size=128
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=10
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=10
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.n=5
        actor_rollout_ref.rollout.gpu_memory_utilization=0.7
        actor_rollout_ref.rollout.tensor_model_parallel_size=4
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        reward_model.enable=True
        reward_model.model.path=Skywork/Skywork-Reward-Llama-3.1-8B
        reward_model.use_reward_loop=True
        reward_model.rollout.name=vllm
        reward_model.rollout.gpu_memory_utilization=0.8
        reward_model.rollout.tensor_model_parallel_size=1
        reward_model.rollout.prompt_length=8192
        reward_model.rollout.response_length=4096
        reward_model.num_workers=8
        algorithm.use_kl_in_reward=False
        trainer.logger=["console","wandb"]
        trainer.val_before_train=False
        trainer.project_name=verl_full_hh_rlhf_examples
        trainer.experiment_name=grpo_mistral13B-skyworkLlama8b-hhrlhf
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=10
        trainer.test_freq=-1
        trainer.total_epochs=5
    """),
    Script("examples/ppo_trainer/run_qwen2-7b_rm.sh", [], """
        algorithm.adv_estimator=gae
        data.train_files=['~/data/gsm8k/train.parquet', '~/data/math/train.parquet']
        data.val_files=['~/data/gsm8k/test.parquet', '~/data/math/test.parquet']
        data.train_batch_size=1024
        data.max_prompt_length=1024
        data.max_response_length=512
        data.filter_overlong_prompts=True
        data.truncation=error
        data.return_raw_chat=True
        actor_rollout_ref.model.path=~/models/Qwen2-7B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1
        actor_rollout_ref.actor.ppo_mini_batch_size=256
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
        actor_rollout_ref.rollout.tensor_model_parallel_size=1
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        critic.optim.lr=1e-5
        critic.model.use_remove_padding=True
        critic.optim.lr_warmup_steps_ratio=0.05
        critic.model.path=~/models/Qwen2-7B-Instruct
        critic.model.enable_gradient_checkpointing=True
        critic.ppo_micro_batch_size_per_gpu=32
        critic.model.fsdp_config.param_offload=False
        critic.model.fsdp_config.optimizer_offload=False
        reward_model.enable=True
        reward_model.model.path=~/models/FsfairX-LLaMA3-RM-v0.1
        reward_model.use_reward_loop=True
        reward_model.rollout.name=vllm
        reward_model.rollout.gpu_memory_utilization=0.8
        reward_model.rollout.tensor_model_parallel_size=1
        reward_model.rollout.prompt_length=2048
        reward_model.rollout.response_length=1024
        reward_model.num_workers=8
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_example
        trainer.val_before_train=False
        trainer.experiment_name=Qwen2-7B-Instruct_hybrid_rm
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=20
        trainer.test_freq=5
        trainer.total_epochs=15
    """),
    Script("examples/ppo_trainer/run_qwen2-7b_rm_legacy.sh", [], """
        algorithm.adv_estimator=gae
        data.train_files=['~/data/gsm8k/train.parquet', '~/data/math/train.parquet']
        data.val_files=['~/data/gsm8k/test.parquet', '~/data/math/test.parquet']
        data.train_batch_size=1024
        data.max_prompt_length=1024
        data.max_response_length=2048
        data.filter_overlong_prompts=True
        data.truncation=error
        data.return_raw_chat=True
        actor_rollout_ref.model.path=~/models/Qwen2.5-3B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1
        actor_rollout_ref.actor.ppo_mini_batch_size=256
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
        actor_rollout_ref.rollout.tensor_model_parallel_size=1
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        critic.optim.lr=1e-5
        critic.model.use_remove_padding=True
        critic.optim.lr_warmup_steps_ratio=0.05
        critic.model.path=~/models/Qwen2.5-3B-Instruct
        critic.model.enable_gradient_checkpointing=True
        critic.ppo_micro_batch_size_per_gpu=32
        critic.model.fsdp_config.param_offload=False
        critic.model.fsdp_config.optimizer_offload=False
        reward_model.enable=True
        reward_model.model.path=~/models/Skywork-Reward-V2-Llama-3.2-3B
        reward_model.use_reward_loop=False
        reward_model.model.use_remove_padding=True
        reward_model.model.fsdp_config.param_offload=True
        reward_model.micro_batch_size_per_gpu=32
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_test_qwen25_rm
        trainer.val_before_train=True
        trainer.experiment_name=legacy_fsdp_reward_model
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=-1
        trainer.test_freq=10
        trainer.total_epochs=15
    """),
    Script("examples/ppo_trainer/run_qwen2-7b_rm_reward_loop_colocate.sh", [], """
        algorithm.adv_estimator=gae
        data.train_files=['~/data/gsm8k/train.parquet', '~/data/math/train.parquet']
        data.val_files=['~/data/gsm8k/test.parquet', '~/data/math/test.parquet']
        data.train_batch_size=1024
        data.max_prompt_length=1024
        data.max_response_length=2048
        data.filter_overlong_prompts=True
        data.truncation=error
        data.return_raw_chat=True
        actor_rollout_ref.model.path=~/models/Qwen2.5-3B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1
        actor_rollout_ref.actor.ppo_mini_batch_size=256
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
        actor_rollout_ref.rollout.tensor_model_parallel_size=1
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        critic.optim.lr=1e-5
        critic.model.use_remove_padding=True
        critic.optim.lr_warmup_steps_ratio=0.05
        critic.model.path=~/models/Qwen2.5-3B-Instruct
        critic.model.enable_gradient_checkpointing=True
        critic.ppo_micro_batch_size_per_gpu=32
        critic.model.fsdp_config.param_offload=False
        critic.model.fsdp_config.optimizer_offload=False
        reward_model.enable=True
        reward_model.model.path=~/models/Skywork-Reward-V2-Llama-3.2-3B
        reward_model.use_reward_loop=True
        reward_model.rollout.name=vllm
        reward_model.rollout.gpu_memory_utilization=0.8
        reward_model.rollout.prompt_length=4096
        reward_model.rollout.response_length=4096
        reward_model.rollout.tensor_model_parallel_size=1
        reward_model.num_workers=8
        reward_model.model.use_remove_padding=True
        reward_model.model.fsdp_config.param_offload=True
        reward_model.micro_batch_size_per_gpu=32
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_test_qwen25_rm
        trainer.val_before_train=False
        trainer.experiment_name=reward_loop_colocate_reward_model
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=-1
        trainer.test_freq=10
        trainer.total_epochs=15
    """),
    Script("examples/ppo_trainer/run_qwen2-7b_rm_seq_balance.sh", [], """
        algorithm.adv_estimator=gae
        data.train_files=['~/data/gsm8k/train.parquet', '~/data/math/train.parquet']
        data.val_files=['~/data/gsm8k/test.parquet', '~/data/math/test.parquet']
        data.train_batch_size=4096
        data.max_prompt_length=4096
        data.max_response_length=4096
        data.filter_overlong_prompts=True
        data.truncation=error
        data.return_raw_chat=True
        actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.ppo_mini_batch_size=512
        actor_rollout_ref.actor.use_dynamic_bsz=True
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.5
        actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24000
        critic.optim.lr=1e-5
        critic.model.use_remove_padding=True
        critic.model.path=Qwen/Qwen2-7B-Instruct
        critic.model.enable_gradient_checkpointing=True
        critic.use_dynamic_bsz=True
        critic.ppo_max_token_len_per_gpu=98304
        critic.model.fsdp_config.param_offload=False
        critic.model.fsdp_config.optimizer_offload=False
        reward_model.enable=True
        reward_model.model.path=sfairXC/FsfairX-LLaMA3-RM-v0.1
        reward_model.use_reward_loop=True
        reward_model.rollout.name=vllm
        reward_model.rollout.gpu_memory_utilization=0.8
        reward_model.rollout.tensor_model_parallel_size=1
        reward_model.rollout.prompt_length=8192
        reward_model.rollout.response_length=4096
        reward_model.num_workers=8
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_example_gsm8k
        trainer.experiment_name=qwen2-7b_hybrid_rm_bsz8k_p4k_r4k_seq_packing
        trainer.n_gpus_per_node=8
        trainer.val_before_train=False
        trainer.nnodes=1
        trainer.save_freq=20
        trainer.test_freq=5
        trainer.total_epochs=15
    """),
    Script("examples/ppo_trainer/run_qwen2-7b_rm_seq_balance_fused_kernels.sh", [], """
        algorithm.adv_estimator=gae
        data.train_files=['~/data/gsm8k/train.parquet', '~/data/math/train.parquet']
        data.val_files=['~/data/gsm8k/test.parquet', '~/data/math/test.parquet']
        data.train_batch_size=4096
        data.max_prompt_length=4096
        data.max_response_length=4096
        data.filter_overlong_prompts=True
        data.truncation=error
        data.return_raw_chat=True
        actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.model.use_fused_kernels=True
        actor_rollout_ref.model.fused_kernel_options.impl_backend=triton
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.ppo_mini_batch_size=512
        actor_rollout_ref.actor.use_dynamic_bsz=True
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu=24000
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.5
        actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24000
        critic.optim.lr=1e-5
        critic.model.use_remove_padding=True
        critic.model.path=Qwen/Qwen2-7B-Instruct
        critic.model.enable_gradient_checkpointing=True
        critic.use_dynamic_bsz=True
        critic.ppo_max_token_len_per_gpu=98304
        critic.model.fsdp_config.param_offload=False
        critic.model.fsdp_config.optimizer_offload=False
        reward_model.enable=True
        reward_model.model.path=sfairXC/FsfairX-LLaMA3-RM-v0.1
        reward_model.use_reward_loop=True
        reward_model.rollout.name=vllm
        reward_model.rollout.gpu_memory_utilization=0.8
        reward_model.rollout.tensor_model_parallel_size=1
        reward_model.rollout.prompt_length=8192
        reward_model.rollout.response_length=4096
        reward_model.num_workers=8
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_example_gsm8k
        trainer.experiment_name=qwen2-7b_hybrid_rm_bsz8k_p4k_r4k_seq_packing_fused_kernel
        trainer.n_gpus_per_node=8
        trainer.val_before_train=False
        trainer.nnodes=1
        trainer.save_freq=20
        trainer.test_freq=5
        trainer.total_epochs=15
    """),
    Script("examples/ppo_trainer/run_qwen2-7b_rm_seq_balance_nsys.sh", [], """
        algorithm.adv_estimator=gae
        data.train_files=$gsm8k_train_path
        data.val_files=$gsm8k_test_path
        data.train_batch_size=4096
        data.max_prompt_length=4096
        data.max_response_length=4096
        data.filter_overlong_prompts=True
        data.truncation=error
        data.return_raw_chat=True
        actor_rollout_ref.model.path=Qwen/Qwen2-7B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.ppo_mini_batch_size=512
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2
        actor_rollout_ref.actor.use_dynamic_bsz=True
        actor_rollout_ref.actor.ppo_max_token_len_per_gpu=12000
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.actor.profiler.enable=True
        actor_rollout_ref.actor.profiler.ranks=[0,4]
        actor_rollout_ref.actor.profiler.all_ranks=False
        actor_rollout_ref.rollout.tensor_model_parallel_size=2
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.5
        actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=24000
        critic.optim.lr=1e-5
        critic.model.use_remove_padding=True
        critic.model.path=Qwen/Qwen2-7B-Instruct
        critic.model.enable_gradient_checkpointing=True
        critic.ppo_micro_batch_size_per_gpu=2
        critic.use_dynamic_bsz=True
        critic.ppo_max_token_len_per_gpu=98304
        critic.model.fsdp_config.param_offload=False
        critic.model.fsdp_config.optimizer_offload=False
        critic.profiler.enable=True
        critic.profiler.ranks=[0,4]
        critic.profiler.all_ranks=False
        reward_model.enable=True
        reward_model.model.path=sfairXC/FsfairX-LLaMA3-RM-v0.1
        reward_model.use_reward_loop=True
        reward_model.rollout.name=vllm
        reward_model.rollout.gpu_memory_utilization=0.8
        reward_model.rollout.tensor_model_parallel_size=1
        reward_model.rollout.prompt_length=8192
        reward_model.rollout.response_length=4096
        reward_model.num_workers=8
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_example_gsm8k
        trainer.experiment_name=qwen2-7b_hybrid_rm_bsz8k_p4k_r4k_seq_packing
        trainer.n_gpus_per_node=8
        trainer.val_before_train=False
        trainer.nnodes=1
        trainer.save_freq=-1
        trainer.test_freq=-1
        trainer.total_epochs=15
        trainer.total_training_steps=6
        global_profiler.profile_continuous_steps=True
        global_profiler.tool=nsys
        global_profiler.steps=[1,2,5]
        global_profiler.global_tool_config.nsys.discrete=True
    """),
    Script("examples/ppo_trainer/run_qwen2.5-3b_rm_legacy.sh", [], """
        algorithm.adv_estimator=gae
        data.train_files=['~/data/gsm8k/train.parquet', '~/data/math/train.parquet']
        data.val_files=['~/data/gsm8k/test.parquet', '~/data/math/test.parquet']
        data.train_batch_size=1024
        data.max_prompt_length=1024
        data.max_response_length=2048
        data.filter_overlong_prompts=True
        data.truncation=error
        data.return_raw_chat=True
        actor_rollout_ref.model.path=~/models/Qwen2.5-3B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1
        actor_rollout_ref.actor.ppo_mini_batch_size=256
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
        actor_rollout_ref.rollout.tensor_model_parallel_size=1
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        critic.optim.lr=1e-5
        critic.model.use_remove_padding=True
        critic.optim.lr_warmup_steps_ratio=0.05
        critic.model.path=~/models/Qwen2.5-3B-Instruct
        critic.model.enable_gradient_checkpointing=True
        critic.ppo_micro_batch_size_per_gpu=32
        critic.model.fsdp_config.param_offload=False
        critic.model.fsdp_config.optimizer_offload=False
        reward_model.enable=True
        reward_model.model.path=~/models/Skywork-Reward-V2-Llama-3.2-3B
        reward_model.use_reward_loop=False
        reward_model.model.use_remove_padding=True
        reward_model.model.fsdp_config.param_offload=True
        reward_model.micro_batch_size_per_gpu=32
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_test_qwen25_rm
        trainer.val_before_train=True
        trainer.experiment_name=legacy_fsdp_reward_model
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=-1
        trainer.test_freq=10
        trainer.total_epochs=15
    """),
    Script("examples/ppo_trainer/run_qwen2.5-3b_rm_reward_loop_colocate.sh", [], """
        algorithm.adv_estimator=gae
        data.train_files=['~/data/gsm8k/train.parquet', '~/data/math/train.parquet']
        data.val_files=['~/data/gsm8k/test.parquet', '~/data/math/test.parquet']
        data.train_batch_size=1024
        data.max_prompt_length=1024
        data.max_response_length=2048
        data.filter_overlong_prompts=True
        data.truncation=error
        data.return_raw_chat=True
        actor_rollout_ref.model.path=~/models/Qwen2.5-3B-Instruct
        actor_rollout_ref.actor.optim.lr=1e-6
        actor_rollout_ref.model.use_remove_padding=True
        actor_rollout_ref.actor.optim.lr_warmup_steps_ratio=0.1
        actor_rollout_ref.actor.ppo_mini_batch_size=256
        actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=16
        actor_rollout_ref.actor.use_kl_loss=False
        actor_rollout_ref.model.enable_gradient_checkpointing=True
        actor_rollout_ref.actor.fsdp_config.param_offload=False
        actor_rollout_ref.actor.fsdp_config.optimizer_offload=False
        actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=16
        actor_rollout_ref.rollout.tensor_model_parallel_size=1
        actor_rollout_ref.rollout.name=vllm
        actor_rollout_ref.rollout.gpu_memory_utilization=0.6
        critic.optim.lr=1e-5
        critic.model.use_remove_padding=True
        critic.optim.lr_warmup_steps_ratio=0.05
        critic.model.path=~/models/Qwen2.5-3B-Instruct
        critic.model.enable_gradient_checkpointing=True
        critic.ppo_micro_batch_size_per_gpu=32
        critic.model.fsdp_config.param_offload=False
        critic.model.fsdp_config.optimizer_offload=False
        reward_model.enable=True
        reward_model.model.path=~/models/Skywork-Reward-V2-Llama-3.2-3B
        reward_model.use_reward_loop=True
        reward_model.rollout.name=vllm
        reward_model.rollout.gpu_memory_utilization=0.8
        reward_model.rollout.tensor_model_parallel_size=1
        reward_model.rollout.prompt_length=4096
        reward_model.rollout.response_length=4096
        reward_model.num_workers=8
        algorithm.use_kl_in_reward=False
        trainer.critic_warmup=0
        trainer.logger=["console","wandb"]
        trainer.project_name=verl_test_qwen25_rm
        trainer.val_before_train=False
        trainer.experiment_name=reward_loop_colocate_reward_model
        trainer.n_gpus_per_node=8
        trainer.nnodes=1
        trainer.save_freq=-1
        trainer.test_freq=10
        trainer.total_epochs=15
    """),
]


def compile_script(script: Script, tmp_path: Path):
    plan = tmp_path / "plan.yaml"
    plan.write_text("{}\n")  # nothing but the script's overrides, as on verl's command line
    return compile_plan(plan, script.overrides)


def test_nineteen_scripts_one_of_them_refused():
    assert len(SCRIPTS) == 19 and len({s.path for s in SCRIPTS}) == 19
    # LoRA, the gpg loss and estimator, and remax run now; what stays refused names its feature.
    assert sum(1 for s in SCRIPTS if s.refused) == 1


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda s: s.path.removeprefix("examples/"))
def test_a_pasted_script_is_accepted_or_refused_only_with_a_named_feature(script: Script, tmp_path: Path):
    result = compile_script(script, tmp_path)
    errors = [f"{d.code} {d.key}: {d.message}" for d in result.errors]
    assert all(e.startswith("RL108 ") for e in errors), errors
    named = [feature for feature in script.refused if any(f"rlconf does not run {feature} yet" in e for e in errors)]
    assert named == script.refused, errors
    assert bool(errors) == bool(script.refused), errors


@pytest.mark.parametrize("script", [s for s in SCRIPTS if not s.refused], ids=lambda s: s.path.removeprefix("examples/"))
def test_an_accepted_script_resolves_the_numbers_verl_computes(script: Script, tmp_path: Path):
    result = compile_script(script, tmp_path)
    assert result.resolved is not None
    values: dict[str, Any] = {}
    for text in script.overrides:
        parts, value = parse_override(text)
        values[".".join(parts)] = value
    verl = verl_normalize(nest(values))
    assert verl.floored == []
    assert_same_numbers(result.resolved.roles, verl)
    served = result.resolved.roles.served_reward_model
    assert (served.replicas if served else None) == verl_served_reward_model_replicas(nest(values))
