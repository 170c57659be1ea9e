"""`data`, `reward_model`, `custom_reward_function`, `algorithm`, `trainer`, and rlconf's own
`placement` and `estimate` sections."""

from typing import Annotated, Literal, NamedTuple

from pydantic import BeforeValidator, Field

from rlconf.schema.common import (
    Fraction,
    KLEstimator,
    MinusOneOrPositive,
    NonNegativeFloat,
    NonNegativeInt,
    PositiveFloat,
    PositiveInt,
    Section,
    UnitInterval,
)
from rlconf.schema.model import RewardModelModel


class DataConfig(Section):
    tokenizer: str | None = None  # Tokenizer path; null: the actor model's.
    train_files: str | list[str] = "~/data/gsm8k/train.parquet"  # Parquet file(s) with verl columns, or `synthetic://echo?size=N&seed=S`.
    val_files: str | list[str] | None = None  # Validation parquet file(s); null: no validation.
    prompt_key: str = "prompt"  # Column holding the chat-message list.
    reward_fn_key: str = "data_source"  # Column that selects the rule-based scorer.
    max_prompt_length: PositiveInt = 512  # Prompt tokens after the chat template (longer ones: see truncation).
    max_response_length: PositiveInt = 512  # Most tokens generated per response.
    train_batch_size: PositiveInt = 1024  # Prompts per training step (global).
    # Prompts per generation round (global); null: train_batch_size. With algorithm.filter_groups, rounds of
    # gen_batch_size prompts run until train_batch_size groups are kept. The data is batched by it, as in verl:
    # an epoch counts prompts ÷ gen_batch_size steps; rlconf trains all of them, drawing into later epochs when
    # steps take several rounds (verl ends the run when total_epochs of data are drawn).
    gen_batch_size: PositiveInt | None = None
    val_batch_size: PositiveInt | None = None  # deprecated in verl: validation runs as one batch
    shuffle: bool = True  # Shuffle training prompts each epoch (seeded by data.seed).
    seed: int | None = 1  # Seed of the data order; null (verl: unseeded) is a fixed order too.
    filter_overlong_prompts: bool = False  # Drop prompts longer than max_prompt_length instead of applying truncation.
    # What to do with a prompt longer than max_prompt_length (after the chat template).
    truncation: Literal["error", "left", "right", "middle"] = "error"
    dataloader_num_workers: NonNegativeInt = 8  # Background workers loading batches.
    return_raw_chat: bool = True  # Keep the raw chat messages in the batch (for reward functions that want them).


class OverlongBufferConfig(Section):
    # DAPO's soft overlong punishment (reward_manager dapo): a response longer than
    # max_resp_len - len loses penalty_factor x (excess / len) of reward, down to -penalty_factor.
    enable: bool = False  # Penalise responses that run into the last `len` tokens of max_resp_len.
    len: PositiveInt = 1  # Tokens of the buffer at the end of max_resp_len where the penalty grows.
    penalty_factor: NonNegativeFloat = 1.0  # Penalty of a response max_resp_len tokens long.
    log: bool = False  # Log reward/overlong_reward/mean and reward/overlong/fraction each step.


class RewardKwargs(Section):
    # Arguments of the reward manager (verl passes them as `+reward_model.reward_kwargs.*`). rlconf reads
    # DAPO's (checked by RL521); other managers' arguments are verl-only keys (RL108).
    overlong_buffer_cfg: OverlongBufferConfig | None = None  # DAPO's overlong penalty; needs reward_manager dapo.
    max_resp_len: PositiveInt | None = None  # DAPO: the length the buffer ends at (usually data.max_response_length).


class RewardLoopRollout(Section):
    # verl 0.9.1's reward loop (reward.reward_model.rollout; verl up to 0.8: reward_model.rollout): the reward
    # model served by a rollout engine, one replica per tensor_model_parallel_size GPUs. Defaults are verl 0.9.1's.
    name: Literal["vllm", "sglang", "trtllm"] | None = None  # The serving engine; set, the reward model is served (the reward loop).
    dtype: Literal["bfloat16", "float16", "float32"] = "bfloat16"  # The served weights' dtype.
    gpu_memory_utilization: Fraction = 0.5  # The engine's share of each GPU it runs on (weights + KV cache).
    free_cache_engine: bool = True  # Sleep (weights and KV cache released) except while scoring.
    tensor_model_parallel_size: PositiveInt = 2  # GPUs per served replica.
    max_num_batched_tokens: PositiveInt = 8192  # Tokens per engine step.
    max_model_len: PositiveInt | None = None  # Longest (prompt, response) scored; null: the model's max_position_embeddings.
    max_num_seqs: PositiveInt = 1024  # Sequences in flight per replica.
    prompt_length: PositiveInt = 2048  # Prompt tokens of a generative judge's request.
    response_length: PositiveInt = 2048  # Tokens a generative judge may generate.


class RewardModelConfig(Section):
    enable: bool = False  # Score responses with a model instead of (or besides) rules.
    # verl up to 0.8 (default true there): false scores with the FSDP reward-model worker even when
    # reward_model.rollout.name is set; null or true serve the model when reward_model.rollout.name is set.
    use_reward_loop: bool | None = None
    # The served reward model's own GPU pool (verl: reward_pool); false: colocated with the actor, asleep while it trains.
    enable_resource_pool: bool = False
    nnodes: NonNegativeInt = 0  # Nodes of the reward model's pool (enable_resource_pool).
    n_gpus_per_node: NonNegativeInt = 8  # GPUs per node of the reward model's pool (enable_resource_pool).
    rollout: RewardLoopRollout = Field(default_factory=RewardLoopRollout)
    strategy: Literal["fsdp", "fsdp2"] = "fsdp2"  # Training backend.
    model: RewardModelModel = Field(default_factory=RewardModelModel)
    micro_batch_size: PositiveInt | None = None  # deprecated: global
    micro_batch_size_per_gpu: PositiveInt | None = None  # Sequences per forward micro batch per GPU.
    max_length: PositiveInt | None = None  # Truncate scored sequences to this many tokens.
    ulysses_sequence_parallel_size: PositiveInt = 1  # Ulysses sequence-parallel size for the reward model.
    use_dynamic_bsz: bool | None = None  # None: critic.use_dynamic_bsz
    forward_max_token_len_per_gpu: PositiveInt | None = None  # None: critic.forward_max_token_len_per_gpu
    # How rewards are assembled from scores (engine/rewards/managers.py): naive (per response), dapo (naive +
    # overlong penalty), batch (the scorer gets the whole batch), prime (per response in a process pool, 300 s
    # each, 0.0 on a timeout or error); gdpo and remote are known, not run (RL108).
    reward_manager: Literal["naive", "batch", "dapo", "prime", "gdpo", "remote"] = "naive"
    reward_kwargs: RewardKwargs = Field(default_factory=RewardKwargs)


class CustomRewardFunction(Section):
    path: str | None = None  # Python file defining your reward function.
    name: str = "compute_score"  # Function name in that file: (data_source, solution_str, ground_truth, extra_info) -> float.


class KLControl(Section):
    type: Literal["fixed", "adaptive"] = "fixed"  # fixed: kl_coef forever; adaptive: proportional controller toward target_kl.
    kl_coef: NonNegativeFloat = 0.001  # Initial (or fixed) KL coefficient in the reward.
    horizon: PositiveInt = 10000  # Adaptive controller horizon in samples.
    target_kl: PositiveFloat = 0.1  # Adaptive controller target KL.


# verl's estimators (core_algos.py AdvantageEstimator). The engine runs gae, grpo, rloo, reinforce_plus_plus and the
# group estimators below; the others are known and refused with RL108 (rlconf/schema/verl_compat.py).
AdvEstimator = Literal["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline", "remax", "opo",
                       "grpo_passk", "gpg", "rloo_vectorized", "grpo_vectorized", "optimal_token_baseline",
                       "tir_optimal_token_baseline", "gdpo"]
# Estimators that compare samples of the same prompt: they need rollout.n > 1.
GROUP_ESTIMATORS: frozenset[str] = frozenset({"grpo", "rloo", "grpo_vectorized", "rloo_vectorized", "grpo_passk", "opo",
                                              "gpg", "reinforce_plus_plus_baseline", "optimal_token_baseline",
                                              "tir_optimal_token_baseline"})


# verl 0.9.1's rejection-sampling options (rollout_corr_helper.SUPPORTED_ROLLOUT_RS_OPTIONS): a divergence
# estimator of log r = log π_old/π_rollout per token — k1 = -log r (bounded below and above, as a ratio),
# k2 = (log r)²/2, k3 = r - 1 - log r (bounded above) — taken per token or as a sequence's sum, mean or max.
# seq_mean_k1 is verl's "geometric" rejection (Geo-RS: the geometric mean of the sequence's token ratios).
ROLLOUT_RS_OPTIONS: tuple[str, ...] = ("token_k1", "token_k2", "token_k3", "seq_sum_k1", "seq_sum_k2", "seq_sum_k3",
                                       "seq_mean_k1", "seq_mean_k2", "seq_mean_k3", "seq_max_k2", "seq_max_k3")


class RejectionCheck(NamedTuple):
    """One rejection-sampling option and its bounds: k1 options keep lower ≤ exp(stat) ≤ upper (ratio bounds,
    compared as logs), the others keep stat ≤ upper (`lower` None)."""

    option: str
    lower: float | None
    upper: float


class RolloutRsError(ValueError):
    """A rollout_rs / rollout_rs_threshold verl refuses; `key`: the one to point at."""

    def __init__(self, key: str, message: str) -> None:
        super().__init__(message)
        self.key = key


def rejection_checks(rollout_rs: str, threshold: str | float | None) -> list[RejectionCheck]:
    """verl's reading of `rollout_rs` and `rollout_rs_threshold` (a RolloutRsError says what is wrong).

    `rollout_rs`: options separated by commas (repeats dropped), every one must pass for a token to stay.
    `threshold`: one spec for all options or one per option, separated by commas; for k1 options
    `lower_upper` (a lone number u means 1/u_u), for the others a single positive upper bound.
    """
    options = list(dict.fromkeys(part.strip() for part in rollout_rs.split(",") if part.strip()))
    known = ", ".join(ROLLOUT_RS_OPTIONS)
    if not options:
        raise RolloutRsError("rollout_rs", f"rollout_rs {rollout_rs!r} names no option; use one or more of {known}")
    unknown = [option for option in options if option not in ROLLOUT_RS_OPTIONS]
    if unknown:
        raise RolloutRsError("rollout_rs", f"rollout_rs option {unknown[0]!r} is not one of verl's: {known}")
    if threshold is None:
        raise RolloutRsError("rollout_rs", f"rollout_rs {rollout_rs!r} needs rollout_rs_threshold, which is null "
                                           "(verl raises on it)")
    specs = [p.strip() for p in threshold.split(",") if p.strip()] if isinstance(threshold, str) else [str(threshold)]
    if len(specs) not in (1, len(options)):
        raise RolloutRsError("rollout_rs_threshold", f"rollout_rs_threshold {threshold!r} gives {len(specs)} "
                             f"thresholds for {len(options)} options ({', '.join(options)}): give one for all or one "
                             "per option")
    specs = specs * len(options) if len(specs) == 1 else specs
    checks = []
    for option, spec in zip(options, specs):
        where = f"rollout_rs_threshold {spec!r} for {option}"
        if option.endswith("k1"):
            lower_text, _, upper_text = spec.partition("_") if "_" in spec else ("", "", spec)
            try:
                upper = float(upper_text)
                lower = float(lower_text) if lower_text else 1.0 / upper
            except (ValueError, ZeroDivisionError):
                raise RolloutRsError("rollout_rs_threshold", f"{where} is not a number or lower_upper") from None
            if not (lower > 0 and upper > 0 and lower <= upper):
                raise RolloutRsError("rollout_rs_threshold", f"{where}: the ratio bounds must be positive with "
                                                             "lower ≤ upper")
            checks.append(RejectionCheck(option, lower, upper))
            continue
        if "_" in spec:
            raise RolloutRsError("rollout_rs_threshold", f"{where}: k2 and k3 options take one upper bound, "
                                                         "not lower_upper")
        try:
            upper = float(spec)
        except ValueError:
            raise RolloutRsError("rollout_rs_threshold", f"{where} is not a number") from None
        if not upper > 0:
            raise RolloutRsError("rollout_rs_threshold", f"{where} must be positive")
        checks.append(RejectionCheck(option, None, upper))
    return checks


class RolloutCorrection(Section):
    # verl's key names. Truncated importance sampling against the rollout engine's own log-probs
    # (vLLM): token (a weight per token) or sequence (one per response); null: off.
    rollout_is: Literal["token", "sequence"] | None = None
    # Upper bound of the IS weights (truncation). null: verl computes no IS weights (rollout_corr_helper.py checks
    # rollout_is and the threshold); accepted with rollout_is null, as verl's own scripts write it (RL552 otherwise).
    rollout_is_threshold: PositiveFloat | None = 2.0
    # Divide the IS weights by their mean (over tokens, or over sequences for rollout_is sequence), so they
    # average 1: over the step's batch, or in bypass mode over each micro batch of all ranks (as verl).
    rollout_is_batch_normalize: bool = False
    # Rejection sampling against the rollout policy: options of ROLLOUT_RS_OPTIONS separated by commas (all
    # must pass); a rejected token leaves the response mask before advantages, critic and actor (in bypass
    # mode: the policy loss of each micro batch). null: off.
    rollout_rs: str | None = None
    # The bounds of rollout_rs: one for all options or one per option, comma-separated; k1 options take
    # lower_upper ratio bounds (a lone u means 1/u to u), k2/k3 an upper bound.
    rollout_rs_threshold: str | float | None = None
    # Bypass mode: the rollout engine's log-probs serve as π_old (no old-log-prob pass); the policy loss
    # is then loss_type's, whatever actor.policy_loss.loss_mode says (as in verl).
    bypass_mode: bool = False
    loss_type: Literal["ppo_clip", "reinforce"] = "ppo_clip"  # bypass mode: PPO clip against π_rollout, or REINFORCE × IS weights.

    def rejection_checks(self) -> list[RejectionCheck]:
        """The rejection-sampling options with their bounds ([] when rollout_rs is null)."""
        return [] if self.rollout_rs is None else rejection_checks(self.rollout_rs, self.rollout_rs_threshold)


# The filter metric of DAPO's dynamic sampling, per response: score (the scorer's score), reward (verl 0.9.1's
# canonical pre-KL reward, its rm_scores summed: here the score plus any overlong penalty), seq_reward (the
# same sum of token scores) or seq_final_reward (the token rewards summed, KL penalty included). verl reads any
# other name (acc) from the reward function's extra info, which this engine does not keep: RL522.
FilterMetric = Literal["score", "seq_reward", "seq_final_reward", "acc", "reward"]


class FilterGroups(Section):
    # DAPO dynamic sampling: drop prompt groups whose n responses all have the same `metric`, generate
    # more prompts until train_batch_size groups are kept, train on exactly that many.
    enable: bool = False  # Filter out prompt groups whose responses all have the same metric.
    metric: FilterMetric = "reward"  # What must differ within a group: score, reward, seq_reward or seq_final_reward run here.
    max_num_gen_batches: int = 0  # Generation batches a step may use before it fails; 0 or less: no limit.


class AlgorithmConfig(Section):
    gamma: UnitInterval = 1.0  # Discount factor (GAE, REINFORCE++).
    lam: UnitInterval = 1.0  # GAE lambda.
    adv_estimator: AdvEstimator = "gae"  # gae needs a critic; grpo, rloo, opo, gpg, grpo_passk, reinforce_plus_plus_baseline compare a prompt's n samples; reinforce_plus_plus whitens reward-to-go.
    norm_adv_by_std_in_grpo: bool = True  # Divide GRPO advantages by the group std (Dr. GRPO turns this off).
    use_kl_in_reward: bool = False  # Subtract a KL penalty from token rewards (needs the reference policy).
    kl_penalty: KLEstimator = "kl"  # KL estimator for the in-reward penalty (a `+` suffix changes nothing here: rewards take no gradient).
    kl_ctrl: KLControl = Field(default_factory=KLControl)
    # Correct for the rollout engine's policy differing from the trainer's (vLLM's bf16 kernels; HF generate's differ less).
    rollout_correction: RolloutCorrection = Field(default_factory=RolloutCorrection)
    filter_groups: FilterGroups = Field(default_factory=FilterGroups)  # DAPO dynamic sampling.


# verl's tracking backends (utils/tracking.py); console, tensorboard and wandb run here, the others
# are known and not applied (RL109).
LoggerName = Literal["console", "tensorboard", "wandb", "tracking", "trackio", "mlflow", "swanlab", "vemlp_wandb", "clearml",
                     "file", "rl_insight"]
# verl takes `trainer.logger=console` as well as a list: one name is a list of one.
LoggerList = Annotated[list[LoggerName], BeforeValidator(lambda value: [value] if isinstance(value, str) else value)]


class TrainerConfig(Section):
    project_name: str = "rlconf"  # Used in the run directory and loggers.
    experiment_name: str = "run"  # Used in the run directory and loggers.
    logger: LoggerList = ["console"]  # Where metrics go (metrics.jsonl is always written); one name or a list, as in verl.
    nnodes: PositiveInt = 1  # Nodes in the cluster.
    n_gpus_per_node: PositiveInt = 8  # GPUs per node (CPU worker processes per node with device cpu).
    device: Literal["cuda", "cpu"] = "cuda"  # cuda, or cpu for tests and the quickstart.
    total_epochs: PositiveInt = 30  # Passes over the training data.
    total_training_steps: PositiveInt | None = None  # Stop after this many steps; null: total_epochs × steps per epoch.
    critic_warmup: NonNegativeInt = 0  # Steps that update only the critic before the actor starts.
    balance_batch: bool = True  # Reorder sequences so each rank gets a similar token count.
    save_freq: MinusOneOrPositive = -1  # Checkpoint after every N steps and after the last step; -1: never (as in verl).
    test_freq: MinusOneOrPositive = -1  # Validate every N steps; -1: never.
    val_before_train: bool = False  # Validate once before the first step.
    log_val_generations: NonNegativeInt = 0  # Validation samples (prompt, response, score) written per validation to val_generations.jsonl and the console.
    resume_mode: str = "auto"  # auto | disable | resume_path, see TrainerConfig docs
    resume_from_path: str | None = None  # Checkpoint directory for resume_mode resume_path.
    default_local_dir: str | None = None  # Run directory (metrics, checkpoints); None: runs/{project_name}/{experiment_name}
    max_actor_ckpt_to_keep: PositiveInt | None = None  # Keep at most this many actor checkpoints; null: all.
    max_critic_ckpt_to_keep: PositiveInt | None = None  # Keep at most this many critic checkpoints; null: all.
    seed: int = 1  # Seed for model init, sampling and dropout.
    # Steps (1-based) for which to write a torch.profiler trace into the run directory.
    profile_steps: list[PositiveInt] = []


class PoolSpec(Section):
    nnodes: PositiveInt = 1  # Nodes in this pool.
    n_gpus_per_node: PositiveInt  # GPUs per node in this pool.


Role = Literal["actor", "rollout", "ref", "critic", "reward_model"]


class PlacementConfig(Section):
    """rlconf extension (verl: resource pools): which GPU group each role runs on.

    Omitted: one pool spanning the cluster with every role colocated (verl's hybrid engine).
    """

    pools: dict[str, PoolSpec]  # Pool name -> size.
    roles: dict[Role, str]  # Role (actor, rollout, ref, critic, reward_model) -> pool name.


class AsyncTrainingConfig(Section):
    """verl 0.9.1's fully asynchronous mode (experimental/fully_async_policy, fully_async_ppo_trainer.yaml).

    Writing this section (any key of it) with hybrid_engine false and a rollout pool of its own runs the
    fully async schedule instead of the one-step off-policy one (docs/off-policy.md)."""

    # Groups the rollout pool may start per weight version beyond what the trainer takes in it, as a fraction:
    # at most required groups × (1 + staleness_threshold) × trigger_parameter_sync_step per version.
    staleness_threshold: NonNegativeFloat = 0.1
    trigger_parameter_sync_step: PositiveInt = 4  # Trainer steps between two weight pushes to the rollout pool.
    # Mini batches (ppo_mini_batch_size groups each) the trainer takes from the queue per step.
    require_batches: PositiveInt = 1
    # Responses interrupted at a weight push and resumed on the new weights (rollout replicas of one GPU; RL108 with
    # tensor_model_parallel_size > 1); false: a push waits for the groups being generated.
    partial_rollout: bool = True
    use_trainer_do_validate: bool = False  # Validate on the trainer's GPUs; rlconf validates on the rollout pool (RL109).
    # verl's dynamic resource scheduling (rollout replicas on the trainer's GPUs too); not run (RL108 when true).
    use_dynamic_resource_scheduling: bool = False
    dynamic_schedule_policy: str = "default"  # Its policy; applies only with use_dynamic_resource_scheduling.
    dynamic_schedule_deactivate_ratio: NonNegativeFloat = 0.3  # Its deactivation ratio; as above.
    dynamic_schedule_enable_rebalance: bool = True  # Its rebalancing of requests in flight; as above.
    # Groups one rollout replica's engine holds at once (verl: concurrent requests per replica); each goes to the
    # trainer when its last response ends and the next takes its place (vLLM; HF generate runs this many a batch).
    concurrent_samples_per_replica: PositiveInt = 16


class EstimateConfig(Section):
    """rlconf extension: hints for the memory estimate in `rlconf explain`."""

    gpu_memory_gib: PositiveFloat = 80.0  # Memory of one GPU (per-GPU estimates are checked against it).
    # Billions of parameters; None: read model.path/config.json if local, else parse "7B" from the name.
    num_params_b: PositiveFloat | None = None
