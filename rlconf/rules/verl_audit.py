"""The audit of every error rule against verl 0.9.1 (issue #30): an error promises that the run would fail
or be wrong, so each says which of these holds. docs/rules.md renders the table (rlconf/docgen.py), the
catalog's `source` names the verl code, and tools/verl_diff.py reads the verdicts to tell an explained
difference from a disagreement. Line numbers are verl 0.9.1's (the PyPI package).
"""

from __future__ import annotations

from dataclasses import dataclass

# Verdicts: verl refuses the same plan in the checks it makes before any GPU is used (the differential tool
# runs these, so verl accepting such a plan is a disagreement); verl accepts the config and its run fails
# later (model load, worker start, vLLM, first step); verl runs and silently does something else, which
# rlconf refuses on purpose; the plan file cannot be read (verl's loader stops too); or it is about
# rlconf's own extensions or the limits of this engine, which make no claim about verl.
REFUSED_BY_VERL = "verl refuses it"
FAILS_IN_VERL = "verl's run fails later"
VERL_DOES_ELSE = "verl runs something else"
UNREADABLE = "no plan to give verl"
ENGINE = "rlconf's extension or engine"


@dataclass(frozen=True)
class Audit:
    verdict: str
    why: str


AUDIT: dict[str, Audit] = {
    "RL001": Audit(UNREADABLE, "no file: hydra has nothing to compose either"),
    "RL002": Audit(UNREADABLE, "OmegaConf's YAML loader raises on the same text"),
    "RL003": Audit(UNREADABLE, "a config that is not a mapping of sections is refused by hydra too"),
    "RL004": Audit(UNREADABLE, "`base:` is rlconf's inheritance; a base that is not there is a missing file"),
    "RL005": Audit(UNREADABLE, "`base:` is rlconf's inheritance; a cycle has no end"),
    "RL006": Audit(UNREADABLE, "hydra's override grammar refuses a `key` without `=` too"),
    "RL007": Audit(UNREADABLE, "YAML tags are refused, never constructed: a `!!python/...` tag would run code"),
    "RL008": Audit(UNREADABLE, "alias bombs and deep nesting: verl would expand them until memory runs out"),
    "RL009": Audit(UNREADABLE, "the path cannot be looked at (too long, a file as a directory, no permission): "
                               "verl's open of it fails the same way"),
    "RL101": Audit(REFUSED_BY_VERL, "hydra composes verl's config in struct mode: `Key '...' is not in struct` "
                                    "(a `+key` adds it; rlconf reads the ones verl's code uses, docs/verl-compat.md)"),
    "RL102": Audit(FAILS_IN_VERL, "typed sections refuse it when verl converts them to dataclasses "
                                  "(utils/config.py L60-64); untyped ones (data, trainer) fail where the value is "
                                  "first used"),
    "RL103": Audit(FAILS_IN_VERL, "verl checks few ranges: a size of 0 divides by zero in the workers, vLLM refuses "
                                  "gpu_memory_utilization outside (0, 1], a non-finite coefficient makes the loss NaN, "
                                  "save_freq/test_freq 0 is `step % 0` at the first step"),
    "RL104": Audit(FAILS_IN_VERL, "verl looks names up where it uses them: an unknown adv_estimator, loss_mode or KL "
                                  "estimator raises at the first step (core_algos.py get_adv_estimator_fn, "
                                  "get_policy_loss_fn, kl_penalty_forward L2251), a rollout name at worker start; "
                                  "loss_agg_mode in ActorConfig.__post_init__ (workers/config/actor.py L211-220)"),
    "RL105": Audit(ENGINE, "the keys it asks for are rlconf's (placement pools)"),
    "RL107": Audit(REFUSED_BY_VERL, "utils/config.py L157-161 (rollout, ref), workers/config/actor.py L200-204 "
                                    "(actor)"),
    "RL108": Audit(ENGINE, "verl runs it; this engine does not yet, and the run would differ without it "
                           "(docs/verl-compat.md)"),
    "RL201": Audit(REFUSED_BY_VERL, "utils/config.py L122-127 asserts it without dynamic batch size; with it, the "
                                    "batch is still split evenly over the data-parallel ranks"),
    "RL202": Audit(REFUSED_BY_VERL, "workers/config/actor.py L224-229 (critic.py twin)"),
    "RL203": Audit(REFUSED_BY_VERL, "workers/engine_workers.py L267-270 asserts it (verl up to 0.8 floored it)"),
    "RL204": Audit(REFUSED_BY_VERL, "workers/engine/utils.py L123-127: each rank's batch must split into whole "
                                    "micro batches"),
    "RL205": Audit(REFUSED_BY_VERL, "workers/config/actor.py L206-210 (actor), utils/config.py L154-155 (rollout, "
                                    "ref)"),
    "RL206": Audit(FAILS_IN_VERL, "verl 0.9.1's workers read only the per-GPU micro batch and assert it is set "
                                  "(workers/engine_workers.py L636-637)"),
    "RL208": Audit(ENGINE, "how this engine splits a generation round over its rollout replicas"),
    "RL301": Audit(FAILS_IN_VERL, "the FSDP engine's device mesh is GPUs ÷ sp by sp: worker start fails"),
    "RL302": Audit(FAILS_IN_VERL, "workers/engine_workers.py L657-661 asserts it at worker start"),
    "RL305": Audit(FAILS_IN_VERL, "models/transformers/monkey_patch.py L343-347 asserts it when the model loads"),
    "RL306": Audit(REFUSED_BY_VERL, "workers/config/actor.py L334-341 (FSDPActorConfig.validate)"),
    "RL307": Audit(FAILS_IN_VERL, "the HSDP device mesh (workers/engine/fsdp/transformer_impl.py L239-241) cannot "
                                  "be built: worker start fails"),
    "RL351": Audit(ENGINE, "placement is rlconf's (verl's resource pools would wait for GPUs that never come)"),
    "RL352": Audit(ENGINE, "placement is rlconf's"),
    "RL353": Audit(ENGINE, "placement is rlconf's"),
    "RL354": Audit(ENGINE, "placement is rlconf's; with hybrid_engine true rollout shares the actor's GPUs, as verl's "
                           "synchronous trainer asserts (trainer/ppo/ray_trainer.py L334)"),
    "RL361": Audit(FAILS_IN_VERL, "the off-policy trainers' resource pools assert a rollout pool "
                                  "(experimental/separation/utils.py L51-52); the synchronous one asserts hybrid_engine "
                                  "(trainer/ppo/ray_trainer.py L334)"),
    "RL362": Audit(VERL_DOES_ELSE, "verl's synchronous trainer never reads rollout.nnodes (rollout stays on the actor's "
                                   "GPUs, the pool is not made), and its one-step trainer asserts hybrid_engine false "
                                   "(experimental/one_step_off_policy/ray_trainer.py L88)"),
    "RL366": Audit(ENGINE, "placement is rlconf's; verl's off-policy trainers put every role but rollout on the trainer "
                           "pool (experimental/separation/utils.py create_resource_pool_manager)"),
    "RL367": Audit(ENGINE, "placement is rlconf's"),
    "RL368": Audit(REFUSED_BY_VERL, "experimental/fully_async_policy/fully_async_trainer.py and "
                                    "fully_async_rollouter.py assert not hybrid_engine in their constructors"),
    "RL369": Audit(ENGINE, "verl asserts train_batch_size == 0 (experimental/fully_async_policy/"
                           "fully_async_rollouter.py) and takes ppo_mini_batch_size × require_batches groups a step; "
                           "rlconf keeps train_batch_size and asks that it be that product"),
    "RL372": Audit(ENGINE, "which process vLLM runs in is rlconf's engine's choice; verl 0.9.1 always starts its vLLM "
                           "server with `--distributed_executor_backend mp` (vllm_async_server.py), so no claim is made "
                           "about verl here"),
    "RL401": Audit(FAILS_IN_VERL, "utils/seqlen_balancing.py L384-386 asserts it at the first step"),
    "RL509": Audit(FAILS_IN_VERL, "vLLM needs a GPU: the rollout server does not start"),
    "RL510": Audit(FAILS_IN_VERL, "workers/rollout/vllm_rollout/vllm_async_server.py L1104-1111 raises for "
                                  "max_position_embeddings; vLLM refuses a prompt longer than max_model_len"),
    "RL514": Audit(FAILS_IN_VERL, "trainer/ppo/v1/trainer_base.py L865-876: resume_path asserts the path, an "
                                  "unknown mode is logged and then fails on the unset checkpoint folder"),
    "RL516": Audit(ENGINE, "rlconf's val_files has no default; verl's names a gsm8k file, which must exist"),
    "RL517": Audit(ENGINE, "random:// model paths are rlconf's"),
    "RL518": Audit(ENGINE, "HF generate is rlconf's CPU rollout"),
    "RL519": Audit(REFUSED_BY_VERL, "utils/config.py L200-203"),
    "RL521": Audit(FAILS_IN_VERL, "the dapo reward manager asserts max_resp_len when it is built; other managers "
                                  "do not take the argument (TypeError at start)"),
    "RL522": Audit(ENGINE, "this engine computes score, reward, seq_reward and seq_final_reward; verl reads other "
                           "names from its reward functions' extra info"),
    "RL524": Audit(VERL_DOES_ELSE, "without filter_groups verl trains on every generated prompt a step, not on "
                                   "train_batch_size (read at verl 0.7.0 and b178a3cd)"),
    "RL526": Audit(ENGINE, "compile_layers is rlconf's"),
    "RL527": Audit(ENGINE, "compile_layers is rlconf's"),
    "RL530": Audit(FAILS_IN_VERL, "grpo_passk raises at the first step (core_algos.py L516-519); rloo_vectorized "
                                  "trains on advantages that are all 0 (L864)"),
    "RL531": Audit(FAILS_IN_VERL, "verl's reward model needs a model to load: with no path of its own it loads its "
                                  "default (~/models/FsfairX-LLaMA3-RM-v0.1), which a run without it fails on"),
    "RL533": Audit(FAILS_IN_VERL, "the batch manager calls its scorer once with the whole batch; without "
                                  "custom_reward_function that is default_compute_score, which takes one response "
                                  "(TypeError at the first step)"),
    "RL534": Audit(ENGINE, "verl's reward_model.model.input_tokenizer defaults to the policy's path, so verl "
                           "re-tokenizes the responses for the reward model unless it is set to null; rlconf's default "
                           "is null, and with null verl's RewardModelWorker feeds the ids as they are too (b178a3cd fsdp_workers.py "
                           "L1699-1700: _do_switch_chat_template False): an id past the reward model's embedding is a "
                           "device-side assert at the first scoring"),
    "RL540": Audit(FAILS_IN_VERL, "the reward loop builds its servers with get_rollout_replica_class("
                                  "reward_model.rollout.name), which has no class for a null name"),
    "RL541": Audit(FAILS_IN_VERL, "main_ppo.py init_resource_pool_mgr raises ValueError for a reward_pool of "
                                  "nnodes or n_gpus_per_node <= 0 when the run starts"),
    "RL542": Audit(FAILS_IN_VERL, "reward_loop/reward_model.py: colocated, split_resource_pool asserts tp divides "
                                  "the pool; on its own pool GPUs // tp = 0 replicas leave nothing to score"),
    "RL544": Audit(FAILS_IN_VERL, "two vLLM engines awake on one GPU whose gpu_memory_utilization shares add up "
                                  "to more than the GPU: the second refuses to start (not enough free memory)"),
    "RL546": Audit(FAILS_IN_VERL, "reward_loop.py _preprocess_reward_inputs asserts raw_prompt in the batch, which "
                                  "only data.return_raw_chat puts there (first scoring)"),
    "RL552": Audit(VERL_DOES_ELSE, "rollout_corr_helper.py compute_rollout_correction_and_rejection_mask computes "
                                   "IS weights only when rollout_is and rollout_is_threshold are both set: a null "
                                   "threshold trains without the weights rollout_is asks for, and says nothing"),
    "RL550": Audit(FAILS_IN_VERL, "rollout_corr_helper.py compute_rollout_rejection_mask raises ValueError at the "
                                  "first step for an unknown option, a missing or non-positive threshold, or a count "
                                  "that does not fit the options; a k1 lower bound above its upper one verl accepts "
                                  "and then rejects every token, which rlconf refuses too"),
}

# What the audit found that rlconf still does differently from verl 0.9.1, left for issues of their own.
OPEN: list[str] = [
    "Deprecated global micro batch sizes (actor.ppo_micro_batch_size, rollout/ref log_prob_micro_batch_size, "
    "critic's): rlconf converts them to per-GPU sizes with a warning (RL106), as verl's workers did up to 0.8; "
    "verl 0.9.1's workers assert the per-GPU key is set (workers/engine_workers.py L636-637), so verl 0.9.1 fails "
    "such a plan at worker start.",
    "trainer.resume_mode given as a checkpoint path: rlconf accepts it; verl 0.9.1 knows only auto, disable and "
    "resume_path (trainer/ppo/v1/trainer_base.py L854-876).",
]

# The last run of tools/verl_diff.py, which needs verl 0.9.1 in a Python of its own (see its docstring).
DIFF_RUN = """\
`tools/verl_diff.py --verl-python /tmp/verlenv/bin/python tests/compiler/bad_plans presets` (verl 0.9.1 from PyPI
with torch 2.13.0+cpu, on a 2-core CPU machine): 130 plans, 80 agree (both accept with the same
per-GPU numbers, or both refuse), 6 explained, 0 disagreements, 44 not compared (rlconf cannot read them: YAML,
loader limits, malformed overrides; verl's loader stops on them too). The explained ones: RL104 (an unknown
rollout name: verl fails at worker start), RL108 twice and RL522 (what this engine does not run), RL509 (vLLM
on CPU: verl's rollout server does not start), and presets/ppo_critic_split.yaml, whose placement (rlconf's)
puts the critic on 4 of the 8 GPUs where verl's side runs every role on all 8."""
