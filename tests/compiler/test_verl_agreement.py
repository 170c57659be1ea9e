"""rlconf's normalization agrees with verl's, case by case.

Each case is a plan (verl key names). `verl_reference.verl_normalize` (an independent re-implementation
of verl's worker-constructor arithmetic, see that module) says what verl does with it:
- "ok": verl runs it; rlconf must accept it and resolve the same per-GPU numbers.
- "raises": verl asserts/raises; rlconf must report an error diagnostic with the given code.
- "floors": verl floors a division silently and runs; rlconf deliberately reports an error instead.
- "silent": verl runs it without complaint (nothing floors); rlconf deliberately refuses it.

Line references: volcengine/verl at b178a3cd56f58b2d502255daba591e92833930a7 (logic also in v0.4.1).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from verl_compare import assert_same_numbers, nest
from verl_reference import verl_normalize

from rlconf.compile import compile_plan

VERL_ERRORS = (AssertionError, ValueError, ZeroDivisionError)

# The table's cases pin a replica per GPU (tp 1) and packing; VERL_DEFAULT_PLANS below leave every
# default to the two sides (verl 0.9.1's: tp 2). The model is one rlconf knows no shape of: the cases
# are about batch arithmetic, and a known shape would add head checks (RL305) that verl's
# normalization does not make.
BASE: dict[str, Any] = {
    "actor_rollout_ref.model.path": "org/model-0.5B",
    "actor_rollout_ref.model.use_remove_padding": True,
    "actor_rollout_ref.rollout.tensor_model_parallel_size": 1,
    "trainer.nnodes": 1,
    "trainer.n_gpus_per_node": 8,
}


@dataclass
class Case:
    id: str
    values: dict[str, Any]
    verl: str  # "ok" | "raises" | "floors" | "silent"
    code: str | None = None  # rlconf's error code when verl does not simply run it
    key: str | None = None  # the key rlconf's diagnostic should name
    expect: dict[str, Any] = field(default_factory=dict)  # hand-computed actor numbers (checks the oracle too)

    def plan(self) -> dict[str, Any]:
        return nest({**BASE, **self.values})


A = "actor_rollout_ref.actor."
R = "actor_rollout_ref.rollout."
F = "actor_rollout_ref.ref."
GPUS = "trainer.n_gpus_per_node"
NODES = "trainer.nnodes"
ADV = "algorithm.adv_estimator"

CASES: list[Case] = [
    # --- verl runs these; the per-GPU numbers must agree ------------------------------------------
    # fsdp_workers.py L240-262 on a single GPU: mini 8 × n 1 ÷ (1 ÷ 1) = 8; accumulation 8 ÷ 4 = 2.
    Case("ok_world1_n1", {NODES: 1, GPUS: 1, "data.train_batch_size": 16, ADV: "reinforce_plus_plus",
                          A + "ppo_mini_batch_size": 8, A + "ppo_micro_batch_size_per_gpu": 4,
                          R + "log_prob_micro_batch_size_per_gpu": 8},
         "ok", expect={"ppo_mini_batch_size_per_gpu": 8, "grad_accum_steps": 2, "optimizer_steps_per_train_step": 2}),
    # fsdp_workers.py L240-262: 16 × n 4 ÷ 2 = 32 per GPU; ref log-prob per GPU given (L264-273 not taken).
    Case("ok_world2_n4_grpo_with_ref", {GPUS: 2, "data.train_batch_size": 32, ADV: "grpo", R + "n": 4,
                                        A + "ppo_mini_batch_size": 16, A + "ppo_micro_batch_size_per_gpu": 8,
                                        A + "use_kl_loss": True, R + "log_prob_micro_batch_size_per_gpu": 16,
                                        F + "log_prob_micro_batch_size_per_gpu": 16},
         "ok", expect={"ppo_mini_batch_size_per_gpu": 32, "grad_accum_steps": 4}),
    # fsdp_workers.py L240-262 with dynamic bsz (no micro assert); seqlen_balancing.py L382-384: 24576 ≥ 1536.
    Case("ok_world8_n5_grpo_dynamic_bsz", {"data.train_batch_size": 1024, "data.max_response_length": 1024, ADV: "grpo",
                                           R + "n": 5, R + "tensor_model_parallel_size": 2,
                                           A + "ppo_mini_batch_size": 256, A + "use_dynamic_bsz": True,
                                           A + "ppo_max_token_len_per_gpu": 24576, A + "use_kl_loss": True,
                                           R + "log_prob_max_token_len_per_gpu": 49152, F + "log_prob_max_token_len_per_gpu": 49152},
         "ok", expect={"ppo_mini_batch_size_per_gpu": 160, "dp_size": 8, "grad_accum_steps": None}),
    # fsdp_workers.py L240-262: ÷ (8 ÷ sp 2) = ÷ 4: 16 × 16 ÷ 4 = 64; accumulation 64 ÷ 8 = 8.
    Case("ok_world8_sp2_n16", {"data.train_batch_size": 64, ADV: "grpo", R + "n": 16,
                               A + "ulysses_sequence_parallel_size": 2, A + "ppo_mini_batch_size": 16,
                               A + "ppo_micro_batch_size_per_gpu": 8, R + "log_prob_micro_batch_size_per_gpu": 16},
         "ok", expect={"dp_size": 4, "ppo_mini_batch_size_per_gpu": 64, "grad_accum_steps": 8}),
    # fsdp_workers.py L240-262 over 2 nodes × 8 with sp 4 (dp 4); L622-628: 16 GPUs ÷ tp 4 = 4 replicas.
    Case("ok_world16_2nodes_sp4_n4_tp4", {NODES: 2, "data.train_batch_size": 128, ADV: "grpo", R + "n": 4,
                                          R + "tensor_model_parallel_size": 4, A + "ulysses_sequence_parallel_size": 4,
                                          A + "ppo_mini_batch_size": 32, A + "ppo_micro_batch_size_per_gpu": 2,
                                          R + "log_prob_micro_batch_size_per_gpu": 4},
         "ok", expect={"dp_size": 4, "ppo_mini_batch_size_per_gpu": 32, "grad_accum_steps": 16}),
    # fsdp_workers.py L240-262 at scale: 64 nodes × 8 = 512 GPUs, 128 × 16 ÷ 512 = 4; L622-628: 64 tp-8 replicas.
    Case("ok_world512_64nodes_n16_tp8", {NODES: 64, "data.train_batch_size": 512, ADV: "grpo", R + "n": 16,
                                         R + "tensor_model_parallel_size": 8, A + "ppo_mini_batch_size": 128,
                                         A + "ppo_micro_batch_size_per_gpu": 4, R + "log_prob_micro_batch_size_per_gpu": 8},
         "ok", expect={"ppo_mini_batch_size_per_gpu": 4, "grad_accum_steps": 1, "optimizer_steps_per_train_step": 4}),
    # fsdp_workers.py L240-262 (deprecated ppo_micro_batch_size 32 ÷ 8 = 4) and L264-273 (log-prob 64 ÷ 8, ref 128 ÷ 8).
    Case("ok_world8_deprecated_micro_keys", {"data.train_batch_size": 256, ADV: "reinforce_plus_plus",
                                             "algorithm.use_kl_in_reward": True, A + "ppo_mini_batch_size": 64,
                                             A + "ppo_micro_batch_size": 32, R + "log_prob_micro_batch_size": 64,
                                             F + "log_prob_micro_batch_size": 128},
         "ok", expect={"ppo_micro_batch_size_per_gpu": 4, "ppo_mini_batch_size_per_gpu": 8, "grad_accum_steps": 2}),
    # fsdp_workers.py L240-262: the deprecated micro batch is divided by world ÷ sp = 4, not by the world 8.
    Case("ok_world8_sp2_deprecated_micro_divided_by_dp", {"data.train_batch_size": 64, ADV: "grpo", R + "n": 4,
                                                          A + "ulysses_sequence_parallel_size": 2,
                                                          A + "ppo_mini_batch_size": 16, A + "ppo_micro_batch_size": 16,
                                                          R + "log_prob_micro_batch_size": 32},
         "ok", expect={"ppo_micro_batch_size_per_gpu": 4, "ppo_mini_batch_size_per_gpu": 16, "grad_accum_steps": 4}),
    # CriticWorker.__init__ L1231-1252: critic mini 64 × rollout_n 1 ÷ 8 = 8; micro 8 → accumulation 1.
    Case("ok_world8_gae_critic", {"data.train_batch_size": 256, ADV: "gae", A + "ppo_mini_batch_size": 64,
                                  A + "ppo_micro_batch_size_per_gpu": 4, R + "log_prob_micro_batch_size_per_gpu": 8,
                                  "critic.ppo_micro_batch_size_per_gpu": 8, "critic.forward_micro_batch_size_per_gpu": 16},
         "ok"),
    # CriticWorker.__init__ L1231-1252: deprecated critic micro 64 ÷ 8 = 8; forward_micro_batch_size
    # (ppo_trainer.yaml: ${critic.ppo_micro_batch_size}) 64 ÷ 8 = 8.
    Case("ok_world8_gae_critic_deprecated_micro", {"data.train_batch_size": 256, ADV: "gae", A + "ppo_mini_batch_size": 64,
                                                   A + "ppo_micro_batch_size_per_gpu": 4,
                                                   R + "log_prob_micro_batch_size_per_gpu": 8, "critic.ppo_micro_batch_size": 64},
         "ok"),
    # Separate pools (verl resource pools): actor world 4 (L240-262) and critic world 4 (L1231-1252).
    Case("ok_split_pools_actor4_critic4", {"data.train_batch_size": 256, ADV: "gae", "algorithm.use_kl_in_reward": True,
                                           A + "ppo_mini_batch_size": 64, A + "ppo_micro_batch_size_per_gpu": 8,
                                           R + "log_prob_micro_batch_size_per_gpu": 16, F + "log_prob_micro_batch_size_per_gpu": 16,
                                           "critic.model.use_remove_padding": True,
                                           "critic.ppo_micro_batch_size_per_gpu": 16, "critic.forward_micro_batch_size_per_gpu": 32,
                                           "placement.pools": {"policy": {"nnodes": 1, "n_gpus_per_node": 4},
                                                               "value": {"nnodes": 1, "n_gpus_per_node": 4}},
                                           "placement.roles": {"actor": "policy", "rollout": "policy", "ref": "policy",
                                                               "critic": "value"}},
         "ok", expect={"dp_size": 4, "ppo_mini_batch_size_per_gpu": 16, "grad_accum_steps": 2}),
    # CriticWorker.__init__ L1231-1252 with the critic's own sp 2 (÷ 4), mini 16 and ppo_epochs 2 (dp_actor.py L541-560).
    Case("ok_world8_gae_n4_critic_sp2_epochs2", {"data.train_batch_size": 64, ADV: "gae", R + "n": 4,
                                                 A + "ppo_mini_batch_size": 32, A + "ppo_micro_batch_size_per_gpu": 8,
                                                 R + "log_prob_micro_batch_size_per_gpu": 16,
                                                 "critic.model.use_remove_padding": True, "critic.ulysses_sequence_parallel_size": 2,
                                                 "critic.ppo_mini_batch_size": 16, "critic.ppo_micro_batch_size_per_gpu": 4,
                                                 "critic.forward_micro_batch_size_per_gpu": 8, "critic.ppo_epochs": 2},
         "ok", expect={"ppo_mini_batch_size_per_gpu": 16, "grad_accum_steps": 2}),
    # seqlen_balancing.py L382-384: 8192 × sp 4 = 32768 ≥ 4096 + 8192; fsdp_workers.py L240-262: 16 × 4 ÷ 4 = 16.
    Case("ok_world16_sp4_dynamic_long_context", {NODES: 2, "data.train_batch_size": 64, "data.max_prompt_length": 4096,
                                                 "data.max_response_length": 8192, ADV: "grpo", R + "n": 4,
                                                 R + "max_num_batched_tokens": 16384,
                                                 A + "ulysses_sequence_parallel_size": 4, A + "ppo_mini_batch_size": 16,
                                                 A + "use_dynamic_bsz": True, A + "ppo_max_token_len_per_gpu": 8192},
         "ok", expect={"dp_size": 4, "ppo_mini_batch_size_per_gpu": 16}),
    # dp_actor.py L541-560: optimizer steps = ppo_epochs 3 × (128 ÷ 32) mini batches = 12.
    Case("ok_world8_ppo_epochs3", {"data.train_batch_size": 128, ADV: "reinforce_plus_plus", A + "ppo_epochs": 3,
                                   A + "ppo_mini_batch_size": 32, A + "ppo_micro_batch_size_per_gpu": 2,
                                   R + "log_prob_micro_batch_size_per_gpu": 4},
         "ok", expect={"ppo_mini_batch_size_per_gpu": 4, "grad_accum_steps": 2, "optimizer_steps_per_train_step": 12}),
    # fsdp_workers.py L240-262 with n 5: 16 × 5 ÷ 8 = 10, micro 5; L622-628: 8 ÷ tp 2 = 4 replicas of 80 sequences.
    Case("ok_world8_n5_tp2_replicas", {"data.train_batch_size": 64, ADV: "grpo", R + "n": 5,
                                       R + "tensor_model_parallel_size": 2, A + "ppo_mini_batch_size": 16,
                                       A + "ppo_micro_batch_size_per_gpu": 5, R + "log_prob_micro_batch_size_per_gpu": 10},
         "ok", expect={"ppo_mini_batch_size_per_gpu": 10, "grad_accum_steps": 2}),
    # dp_actor.py L541-560: data.split(8) over 12 sequences per GPU makes 2 mini batches (the last short),
    # so 2 optimizer steps; rlconf warns RL207 but must still count them.
    Case("ok_world8_train_not_multiple_of_mini_counts_short_last_minibatch",
         {"data.train_batch_size": 96, ADV: "reinforce_plus_plus", A + "ppo_mini_batch_size": 64,
          A + "ppo_micro_batch_size_per_gpu": 4, R + "log_prob_micro_batch_size_per_gpu": 8},
         "ok", expect={"ppo_mini_batch_size_per_gpu": 8, "optimizer_steps_per_train_step": 2}),

    # --- verl asserts or raises; rlconf reports the matching error --------------------------------
    # utils/config.py L87-113: (100 × 1) % 8 != 0.
    Case("raises_train_times_n_not_divisible_by_world", {"data.train_batch_size": 100, ADV: "reinforce_plus_plus",
                                                         A + "ppo_mini_batch_size": 50, A + "ppo_micro_batch_size_per_gpu": 1,
                                                         R + "log_prob_micro_batch_size_per_gpu": 1},
         "raises", "RL201", "data.train_batch_size"),
    # workers/config/actor.py L200-221: train_batch_size 64 < ppo_mini_batch_size 128.
    Case("raises_actor_mini_larger_than_train", {"data.train_batch_size": 64, ADV: "reinforce_plus_plus",
                                                 A + "ppo_mini_batch_size": 128, A + "ppo_micro_batch_size_per_gpu": 4,
                                                 R + "log_prob_micro_batch_size_per_gpu": 4},
         "raises", "RL202", A + "ppo_mini_batch_size"),
    # fsdp_workers.py L240-262: 64 ÷ 8 = 8 per GPU, 8 % 3 != 0.
    Case("raises_mini_per_gpu_not_divisible_by_micro", {"data.train_batch_size": 128, ADV: "reinforce_plus_plus",
                                                        A + "ppo_mini_batch_size": 64, A + "ppo_micro_batch_size_per_gpu": 3,
                                                        R + "log_prob_micro_batch_size_per_gpu": 4},
         "raises", "RL204", A + "ppo_micro_batch_size_per_gpu"),
    # fsdp_workers.py L240-262: 8 per GPU, micro 16: 8 % 16 != 0 (and 8 // 16 == 0).
    Case("raises_micro_larger_than_mini_per_gpu", {"data.train_batch_size": 128, ADV: "reinforce_plus_plus",
                                                   A + "ppo_mini_batch_size": 64, A + "ppo_micro_batch_size_per_gpu": 16,
                                                   R + "log_prob_micro_batch_size_per_gpu": 16},
         "raises", "RL204", A + "ppo_micro_batch_size_per_gpu"),
    # utils/config.py L117-143: neither micro batch key and no dynamic bsz.
    Case("raises_no_micro_batch_without_dynamic_bsz", {"data.train_batch_size": 128, ADV: "reinforce_plus_plus",
                                                       A + "ppo_mini_batch_size": 64, R + "log_prob_micro_batch_size_per_gpu": 4},
         "raises", "RL205", A + "ppo_micro_batch_size_per_gpu"),
    # utils/config.py L117-143: deprecated and per-GPU micro batch both set.
    Case("raises_deprecated_and_per_gpu_both_set", {"data.train_batch_size": 128, ADV: "reinforce_plus_plus",
                                                    A + "ppo_mini_batch_size": 64, A + "ppo_micro_batch_size": 32,
                                                    A + "ppo_micro_batch_size_per_gpu": 4, R + "log_prob_micro_batch_size_per_gpu": 4},
         "raises", "RL107", A + "ppo_micro_batch_size"),
    # workers/config/actor.py FSDPActorConfig.validate: sp 2 needs model.use_remove_padding.
    Case("raises_actor_sp2_without_remove_padding", {"actor_rollout_ref.model.use_remove_padding": False,
                                                     "data.train_batch_size": 128, ADV: "reinforce_plus_plus",
                                                     A + "ulysses_sequence_parallel_size": 2, A + "ppo_mini_batch_size": 64,
                                                     A + "ppo_micro_batch_size_per_gpu": 4, R + "log_prob_micro_batch_size_per_gpu": 4},
         "raises", "RL306", "actor_rollout_ref.model.use_remove_padding"),
    # workers/config/critic.py L202-211: the critic's sp 2 needs critic.model.use_remove_padding.
    Case("raises_critic_sp2_without_critic_remove_padding", {"data.train_batch_size": 128, ADV: "gae",
                                                             A + "ppo_mini_batch_size": 64, A + "ppo_micro_batch_size_per_gpu": 4,
                                                             R + "log_prob_micro_batch_size_per_gpu": 4,
                                                             "critic.ulysses_sequence_parallel_size": 2,
                                                             "critic.model.use_remove_padding": False,
                                                             "critic.ppo_micro_batch_size_per_gpu": 8},
         "raises", "RL306", "critic.model.use_remove_padding"),
    # fsdp_workers.py L622-628: rollout world 8 % tp 3 != 0.
    Case("raises_tp_not_dividing_rollout_world", {"data.train_batch_size": 128, ADV: "reinforce_plus_plus",
                                                  R + "tensor_model_parallel_size": 3, A + "ppo_mini_batch_size": 64,
                                                  A + "ppo_micro_batch_size_per_gpu": 4, R + "log_prob_micro_batch_size_per_gpu": 4},
         "raises", "RL302", R + "tensor_model_parallel_size"),
    # workers/rollout/replica.py L96-105: tp 8 on nodes of 4 GPUs runs on two whole nodes (rlconf warns, RL303).
    Case("runs_tp_spanning_nodes", {NODES: 2, GPUS: 4, "data.train_batch_size": 128, ADV: "reinforce_plus_plus",
                                   R + "tensor_model_parallel_size": 8, A + "ppo_mini_batch_size": 64,
                                   A + "ppo_micro_batch_size_per_gpu": 4, R + "log_prob_micro_batch_size_per_gpu": 4},
         "ok"),
    # workers/rollout/replica.py L96-105 with a resource pool of 2 nodes × 2 GPUs (cluster nodes have 4):
    # a tp-4 replica spans the pool's two nodes, and runs (rlconf warns, RL303).
    Case("runs_tp_spanning_nodes_of_its_pool", {NODES: 2, GPUS: 4, "data.train_batch_size": 64, ADV: "grpo", R + "n": 4,
                                               R + "tensor_model_parallel_size": 4, A + "ppo_mini_batch_size": 32,
                                               A + "ppo_micro_batch_size_per_gpu": 4, R + "log_prob_micro_batch_size_per_gpu": 8,
                                               "placement.pools": {"policy": {"nnodes": 2, "n_gpus_per_node": 2}},
                                               "placement.roles": {"actor": "policy", "rollout": "policy"}},
         "ok"),
    # utils/seqlen_balancing.py L382-384: 4096 × sp 1 < 1024 + 4096.
    Case("raises_dynamic_token_budget_below_sequence", {"data.train_batch_size": 128, "data.max_prompt_length": 1024,
                                                        "data.max_response_length": 4096, ADV: "grpo", R + "n": 4,
                                                        A + "ppo_mini_batch_size": 64, A + "use_dynamic_bsz": True,
                                                        A + "ppo_max_token_len_per_gpu": 4096,
                                                        R + "log_prob_max_token_len_per_gpu": 8192},
         "raises", "RL401", A + "ppo_max_token_len_per_gpu"),
    # utils/config.py L87-113 (critic twin of actor.py L200-221): critic mini 512 > train 256.
    Case("raises_critic_mini_larger_than_train", {"data.train_batch_size": 256, ADV: "gae", A + "ppo_mini_batch_size": 64,
                                                  A + "ppo_micro_batch_size_per_gpu": 4, R + "log_prob_micro_batch_size_per_gpu": 8,
                                                  "critic.ppo_mini_batch_size": 512, "critic.ppo_micro_batch_size_per_gpu": 8},
         "raises", "RL202", "critic.ppo_mini_batch_size"),
    # CriticWorker.__init__ L1231-1252: critic 64 ÷ 8 = 8 per GPU, 8 % 3 != 0.
    Case("raises_critic_mini_per_gpu_not_divisible_by_micro", {"data.train_batch_size": 256, ADV: "gae",
                                                               A + "ppo_mini_batch_size": 64, A + "ppo_micro_batch_size_per_gpu": 4,
                                                               R + "log_prob_micro_batch_size_per_gpu": 8,
                                                               "critic.ppo_micro_batch_size_per_gpu": 3},
         "raises", "RL204", "critic.ppo_micro_batch_size_per_gpu"),
    # workers/config/actor.py L200-221: deprecated ppo_micro_batch_size 4 × sp 1 < 8 GPUs
    # (the worker, fsdp_workers.py L240-262, would floor it to 0 and divide by zero).
    Case("raises_deprecated_actor_micro_below_world", {"data.train_batch_size": 128, ADV: "reinforce_plus_plus",
                                                       A + "ppo_mini_batch_size": 64, A + "ppo_micro_batch_size": 4,
                                                       R + "log_prob_micro_batch_size_per_gpu": 4},
         "raises", "RL206", A + "ppo_micro_batch_size"),
    # fsdp_workers.py L240-262: 8 × 1 ÷ 16 floors to 0, `assert ppo_mini_batch_size > 0` fails.
    Case("raises_mini_times_n_floors_to_zero", {NODES: 2, "data.train_batch_size": 16, ADV: "reinforce_plus_plus",
                                                A + "ppo_mini_batch_size": 8, A + "ppo_micro_batch_size_per_gpu": 1,
                                                R + "log_prob_micro_batch_size_per_gpu": 1},
         "raises", "RL203", A + "ppo_mini_batch_size"),
    # fsdp_workers.py L169-175: the (dp, sp) device mesh needs sp 3 to divide 8 GPUs.
    Case("raises_sp_not_dividing_world", {"data.train_batch_size": 96, ADV: "reinforce_plus_plus",
                                          A + "ulysses_sequence_parallel_size": 3, A + "ppo_mini_batch_size": 48,
                                          A + "ppo_micro_batch_size_per_gpu": 2, R + "log_prob_micro_batch_size_per_gpu": 2},
         "raises", "RL301", A + "ulysses_sequence_parallel_size"),

    # core_algos.py L315-317 (verl 0.9.1): GRPO with n = 1 runs, each group of one scoring its raw reward;
    # rlconf warns (RL501) and resolves verl's numbers: 64 × 1 ÷ 8 = 8 per GPU, 8 ÷ 4 = 2 micro batches.
    Case("ok_grpo_n1_runs_as_in_verl", {"data.train_batch_size": 128, ADV: "grpo", R + "n": 1,
                                        A + "ppo_mini_batch_size": 64, A + "ppo_micro_batch_size_per_gpu": 4,
                                        R + "log_prob_micro_batch_size_per_gpu": 4},
         "ok", expect={"ppo_mini_batch_size_per_gpu": 8, "grad_accum_steps": 2, "optimizer_steps_per_train_step": 2}),
    # --- verl floors silently and runs; rlconf reports an error on purpose -------------------------
    # fsdp_workers.py L240-262: 12 × n 2 ÷ 16 = 1.5 floors to 1 (verl then does 6 mini batches, not 4).
    Case("floors_in_verl_but_rlconf_errors_RL203_mini_times_n_over_dp", {NODES: 2, "data.train_batch_size": 48, ADV: "grpo",
                                                                        R + "n": 2, A + "ppo_mini_batch_size": 12,
                                                                        A + "ppo_micro_batch_size_per_gpu": 1,
                                                                        R + "log_prob_micro_batch_size_per_gpu": 2},
         "floors", "RL203", A + "ppo_mini_batch_size"),
    # fsdp_workers.py L240-262: deprecated ppo_micro_batch_size 12 ÷ 8 = 1.5 floors to 1.
    Case("floors_in_verl_but_rlconf_errors_RL206_deprecated_actor_micro", {"data.train_batch_size": 96, ADV: "reinforce_plus_plus",
                                                                          A + "ppo_mini_batch_size": 96, A + "ppo_micro_batch_size": 12,
                                                                          R + "log_prob_micro_batch_size_per_gpu": 4},
         "floors", "RL206", A + "ppo_micro_batch_size"),
    # fsdp_workers.py L264-273: deprecated log_prob_micro_batch_size 12 ÷ 8 floors to 1.
    Case("floors_in_verl_but_rlconf_errors_RL206_deprecated_log_prob_micro", {"data.train_batch_size": 96, ADV: "reinforce_plus_plus",
                                                                             A + "ppo_mini_batch_size": 96,
                                                                             A + "ppo_micro_batch_size_per_gpu": 4,
                                                                             R + "log_prob_micro_batch_size": 12},
         "floors", "RL206", R + "log_prob_micro_batch_size"),
    # CriticWorker.__init__ L1231-1252: deprecated critic.ppo_micro_batch_size 12 ÷ 8 floors to 1.
    Case("floors_in_verl_but_rlconf_errors_RL206_deprecated_critic_micro", {"data.train_batch_size": 96, ADV: "gae",
                                                                           A + "ppo_mini_batch_size": 96,
                                                                           A + "ppo_micro_batch_size_per_gpu": 4,
                                                                           R + "log_prob_micro_batch_size_per_gpu": 4,
                                                                           "critic.ppo_micro_batch_size": 12},
         "floors", "RL206", "critic.ppo_micro_batch_size"),
    # CriticWorker.__init__ L1231-1252: critic mini 12 × rollout_n 2 ÷ 16 = 1.5 floors to 1.
    Case("floors_in_verl_but_rlconf_errors_RL203_critic_mini", {NODES: 2, "data.train_batch_size": 48, ADV: "gae", R + "n": 2,
                                                               A + "ppo_mini_batch_size": 24, A + "ppo_micro_batch_size_per_gpu": 1,
                                                               R + "log_prob_micro_batch_size_per_gpu": 2,
                                                               "critic.ppo_mini_batch_size": 12,
                                                               "critic.ppo_micro_batch_size_per_gpu": 1},
         "floors", "RL203", "critic.ppo_mini_batch_size"),
    # core_algos.py L864 (verl 0.9.1, rloo_vectorized): verl runs n = 1 silently, and every advantage is 0.
    Case("silent_in_verl_but_rlconf_errors_RL530_rloo_vectorized_n1",
         {"data.train_batch_size": 128, ADV: "rloo_vectorized", R + "n": 1, A + "ppo_mini_batch_size": 64,
          A + "ppo_micro_batch_size_per_gpu": 4, R + "log_prob_micro_batch_size_per_gpu": 4},
         "silent", "RL530", R + "n"),
]


def compile_case(case: Case, tmp_path: Path):
    path = tmp_path / "plan.yaml"
    path.write_text(json.dumps(case.plan()))  # JSON is YAML
    return compile_plan(path)


def describe(result) -> str:
    return "\n".join(f"{d.code} {d.key}: {d.message}" for d in result.diagnostics)


def test_the_table_is_large_and_varied():
    assert len(CASES) >= 15
    assert len({c.id for c in CASES}) == len(CASES)
    worlds = {c.values.get(NODES, BASE[NODES]) * c.values.get(GPUS, BASE[GPUS]) for c in CASES}
    assert {1, 2, 8, 16, 512} <= worlds
    assert {"ok", "raises", "floors", "silent"} == {c.verl for c in CASES}


@pytest.mark.parametrize("case", [c for c in CASES if c.expect], ids=lambda c: c.id)
def test_oracle_matches_hand_computed_numbers(case: Case):
    """The oracle itself against numbers worked out by hand from the verl lines cited above."""
    actor = verl_normalize(case.plan()).actor
    for key, value in case.expect.items():
        assert actor[key] == value, key


@pytest.mark.parametrize("case", [c for c in CASES if c.verl == "ok"], ids=lambda c: c.id)
def test_rlconf_resolves_what_verl_computes(case: Case, tmp_path: Path):
    verl = verl_normalize(case.plan())
    assert verl.floored == [], "an 'ok' case must not rely on verl's silent flooring"
    result = compile_case(case, tmp_path)
    assert not result.errors, describe(result)
    assert_same_numbers(result.resolved.roles, verl)


@pytest.mark.parametrize("case", [c for c in CASES if c.verl == "raises"], ids=lambda c: c.id)
def test_rlconf_errors_where_verl_raises(case: Case, tmp_path: Path):
    with pytest.raises(VERL_ERRORS):
        verl_normalize(case.plan())
    result = compile_case(case, tmp_path)
    codes = {d.code for d in result.errors}
    assert case.code in codes, describe(result)
    assert any(d.code == case.code and d.key == case.key for d in result.errors), describe(result)
    assert result.resolved is None and result.exit_code() == 1


@pytest.mark.parametrize("case", [c for c in CASES if c.verl in ("floors", "silent")], ids=lambda c: c.id)
def test_rlconf_errors_where_verl_floors_or_runs_silently(case: Case, tmp_path: Path):
    verl = verl_normalize(case.plan())  # verl accepts the plan: no exception
    if case.verl == "floors":
        assert verl.floored, "the case should exercise one of verl's silent floor divisions"
    else:
        assert not verl.floored
    result = compile_case(case, tmp_path)
    assert any(d.code == case.code and d.key == case.key for d in result.errors), describe(result)
    assert result.resolved is None


# --- verl-default plans: only what verl 0.9.1 makes a plan write -----------------------------------
# verl requires the micro batch sizes (and a rollout backend); everything else is each side's default.
VERL_REQUIRED = {
    "actor_rollout_ref.rollout.name": "vllm",
    A + "ppo_micro_batch_size_per_gpu": 8,
    R + "log_prob_micro_batch_size_per_gpu": 16,
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu": 16,
    "critic.ppo_micro_batch_size_per_gpu": 8,
}
VERL_DEFAULT_PLANS = [
    pytest.param({NODES: 1, GPUS: 8}, id="ppo_1x8"),
    pytest.param({NODES: 2, GPUS: 8}, id="ppo_2x8"),
    pytest.param({NODES: 1, GPUS: 4}, id="ppo_1x4"),
    pytest.param({NODES: 4, GPUS: 8}, id="ppo_4x8"),
    pytest.param({NODES: 1, GPUS: 8, ADV: "grpo", R + "n": 5, A + "use_kl_loss": True}, id="grpo_n5_kl_1x8"),
    pytest.param({NODES: 2, GPUS: 4, ADV: "grpo", R + "n": 4}, id="grpo_n4_2x4"),
    pytest.param({NODES: 1, GPUS: 2, ADV: "rloo", R + "n": 4}, id="rloo_n4_1x2"),
]


@pytest.mark.parametrize("world", VERL_DEFAULT_PLANS)
def test_explain_of_a_verl_default_plan_matches_verl(world: dict[str, Any], tmp_path: Path):
    """`rlconf explain --format json` of a plan that leaves verl's defaults alone (tp 2, so a replica per
    two GPUs) resolves the replicas and per-GPU numbers verl 0.9.1 computes on the same world size."""
    from typer.testing import CliRunner

    from rlconf.cli import app
    from rlconf.resolved import ResolvedPlan

    values = {**VERL_REQUIRED, **world}
    plan = tmp_path / "plan.yaml"
    plan.write_text("{}\n")
    overrides = [f"{key}={json.dumps(value)}" for key, value in values.items()]
    out = CliRunner().invoke(app, ["explain", str(plan), *overrides, "--format", "json"])
    assert out.exit_code == 0, out.output
    resolved = ResolvedPlan.model_validate_json(out.output)
    verl = verl_normalize(nest(values))
    assert verl.floored == []
    assert resolved.roles.rollout.tensor_parallel_size == 2
    assert resolved.roles.rollout.replicas == world[NODES] * world[GPUS] // 2
    assert_same_numbers(resolved.roles, verl)
