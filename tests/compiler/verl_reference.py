"""A reference oracle: verl's batch normalization, re-implemented independently of rlconf.

Written in the style of verl's worker constructors: take a copy of the plan's numbers, mutate
them in place with floor division (`//=`), and fail with the same kind of exception verl would
(`AssertionError` for `assert`, `ValueError` for an explicit raise, `ZeroDivisionError` where
verl would divide by a value that floored to 0). Nothing here imports rlconf.

Sources (volcengine/verl at b178a3cd56f58b2d502255daba591e92833930a7 unless noted; v0.4.1 holds
the same logic in trainer/ppo/ray_trainer.py `_validate_config`):
- verl/utils/config.py L87-113 `validate_config`, L117-143 `check_mutually_exclusive`
- verl/workers/config/actor.py L200-221 `ActorConfig.validate`, FSDPActorConfig.validate
- verl/workers/config/critic.py L202-211 `FSDPCriticConfig.__post_init__`
- verl/workers/fsdp_workers.py L240-273 `ActorRolloutRefWorker.__init__`,
  L622-628 (rollout tp divides the world), L1231-1252 `CriticWorker.__init__`
- verl/workers/rollout/replica.py L96-105 (a replica on one node, or on whole nodes)
- verl/utils/seqlen_balancing.py L382-384 (dynamic bsz: token budget >= longest sequence)
- verl/workers/actor/dp_actor.py L541-560 (mini batches via DataProto.split, grad accumulation)

The input is the plan as a nested dict with verl's key names. Keys a plan leaves out take the
defaults of verl 0.9.1's config (DEFAULTS, read from rlconf/schema/verl_keys.json: facts taken from
verl's package, not rlconf code), including its `${...}` interpolations
(critic.ppo_mini_batch_size -> actor's, ref/rollout token budgets -> actor's, ...).
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# The keys the oracle reads. Their defaults are verl 0.9.1's, read from the fact file that
# tools/verl_keys.py writes from verl's package (verl/trainer/config/_generated_ppo_trainer.yaml).
ORACLE_KEYS = (
    "trainer.nnodes", "trainer.n_gpus_per_node", "data.train_batch_size", "data.max_prompt_length",
    "data.max_response_length", "algorithm.adv_estimator", "algorithm.use_kl_in_reward",
    "actor_rollout_ref.model.use_remove_padding", "actor_rollout_ref.actor.ppo_mini_batch_size",
    "actor_rollout_ref.actor.ppo_micro_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.actor.use_dynamic_bsz", "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.actor.ulysses_sequence_parallel_size", "actor_rollout_ref.actor.ppo_epochs",
    "actor_rollout_ref.actor.use_kl_loss", "actor_rollout_ref.rollout.n",
    "actor_rollout_ref.rollout.tensor_model_parallel_size", "actor_rollout_ref.rollout.log_prob_micro_batch_size",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu", "actor_rollout_ref.ref.log_prob_micro_batch_size",
    "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu", "critic.model.use_remove_padding",
    "critic.ppo_micro_batch_size", "critic.ppo_max_token_len_per_gpu", "critic.ulysses_sequence_parallel_size",
)
VERL_KEYS = Path(__file__).resolve().parents[2] / "rlconf" / "schema" / "verl_keys.json"
_VERL = json.loads(VERL_KEYS.read_text())
VERL_VERSION = _VERL["verl_version"]
DEFAULTS: dict[str, Any] = {key: _VERL["keys"][key]["default"] for key in ORACLE_KEYS}
# critic.ppo_micro_batch_size_per_gpu follows the deprecated global critic.ppo_micro_batch_size in verl
# 0.9.1; the oracle keeps the workers' reading (the deprecated value divided by dp) and starts it at null.
DEFAULTS["critic.ppo_micro_batch_size_per_gpu"] = None


def _get(plan: dict, dotted: str, default: Any = "__verl_default__") -> Any:
    node: Any = plan
    for part in dotted.split("."):
        if not isinstance(node, dict) or node.get(part) is None:
            return DEFAULTS.get(dotted) if default == "__verl_default__" else default
        node = node[part]
    return node


@dataclass
class Section:
    """A mutable bag of numbers, like the OmegaConf node verl's worker mutates."""

    values: dict[str, Any]

    def __getattr__(self, name: str) -> Any:
        try:
            return self.__dict__["values"][name]
        except KeyError:
            raise AttributeError(name) from None

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "values":
            super().__setattr__(name, value)
        else:
            self.values[name] = value


@dataclass
class VerlResult:
    """What verl's workers end up with, per role. `floored` lists the divisions that lost a remainder."""

    actor: dict[str, Any] = field(default_factory=dict)
    rollout: dict[str, Any] = field(default_factory=dict)
    ref: dict[str, Any] | None = None
    critic: dict[str, Any] | None = None
    floored: list[str] = field(default_factory=list)


def _floor_div(section: Section, key: str, by: int, floored: list[str], label: str) -> None:
    """`section.key //= by`, noting (not failing) when verl loses a remainder."""
    value = section.values[key]
    if value % by:
        floored.append(f"{label}: {value} // {by} = {value // by} (remainder {value % by} dropped)")
    section.values[key] = value // by


def _split_count(length: int, split_size: int) -> int:
    """DataProto.split(split_size) makes `range(0, length, split_size)` chunks (verl/protocol.py)."""
    return len(range(0, length, split_size))  # range() raises ValueError for a step of 0, as verl's split does


def _check_mutually_exclusive(mbs: Any, mbs_per_gpu: Any, name: str) -> None:
    # verl/utils/config.py L117-143 check_mutually_exclusive
    if mbs is None and mbs_per_gpu is None:
        raise ValueError(f"[{name}] Please set at least one of micro batch size or micro batch size per gpu.")
    if mbs is not None and mbs_per_gpu is not None:
        raise ValueError(f"[{name}] You have set both the deprecated micro batch size and the per-gpu one.")


def _pools(plan: dict) -> dict[str, int]:
    """GPUs per role: one global pool (verl's default resource pool), or rlconf's placement pools
    (verl's ResourcePoolManager with one pool per name)."""
    nnodes, per_node = _get(plan, "trainer.nnodes"), _get(plan, "trainer.n_gpus_per_node")
    placement = plan.get("placement")
    roles = ("actor", "rollout", "ref", "critic")
    if not placement:
        return {role: nnodes * per_node for role in roles}
    sizes = {name: spec.get("nnodes", 1) * spec["n_gpus_per_node"] for name, spec in placement["pools"].items()}
    return {role: sizes[placement["roles"][role]] for role in roles if role in placement["roles"]}


def _pool_gpus_per_node(plan: dict, role: str) -> int:
    placement = plan.get("placement")
    if not placement:
        return _get(plan, "trainer.n_gpus_per_node")
    return placement["pools"][placement["roles"][role]]["n_gpus_per_node"]


def verl_normalize(plan: dict) -> VerlResult:
    """Run verl's config validation and worker-constructor normalization on `plan`.

    Returns the per-GPU values verl's workers would use; raises what verl would raise.
    """
    cfg = copy.deepcopy(plan)
    floored: list[str] = []
    nnodes, per_node = _get(cfg, "trainer.nnodes"), _get(cfg, "trainer.n_gpus_per_node")
    n_gpus = nnodes * per_node
    train_batch_size = _get(cfg, "data.train_batch_size")
    n = _get(cfg, "actor_rollout_ref.rollout.n")
    seq_len = _get(cfg, "data.max_prompt_length") + _get(cfg, "data.max_response_length")
    pools = _pools(cfg)

    A = "actor_rollout_ref.actor"
    actor = Section({k: _get(cfg, f"{A}.{k}") for k in (
        "ppo_mini_batch_size", "ppo_micro_batch_size", "ppo_micro_batch_size_per_gpu", "use_dynamic_bsz",
        "ppo_max_token_len_per_gpu", "ulysses_sequence_parallel_size", "ppo_epochs", "use_kl_loss")})
    R = "actor_rollout_ref.rollout"
    rollout = Section({
        "n": n,
        "tensor_model_parallel_size": _get(cfg, f"{R}.tensor_model_parallel_size"),
        "log_prob_micro_batch_size": _get(cfg, f"{R}.log_prob_micro_batch_size"),
        "log_prob_micro_batch_size_per_gpu": _get(cfg, f"{R}.log_prob_micro_batch_size_per_gpu"),
        # ppo_trainer.yaml: ${actor_rollout_ref.actor.use_dynamic_bsz} / ${...ppo_max_token_len_per_gpu}
        "log_prob_use_dynamic_bsz": _get(cfg, f"{R}.log_prob_use_dynamic_bsz", actor.use_dynamic_bsz),
        "log_prob_max_token_len_per_gpu": _get(cfg, f"{R}.log_prob_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu),
    })
    F = "actor_rollout_ref.ref"
    ref = Section({
        "log_prob_micro_batch_size": _get(cfg, f"{F}.log_prob_micro_batch_size"),
        "log_prob_micro_batch_size_per_gpu": _get(cfg, f"{F}.log_prob_micro_batch_size_per_gpu"),
        "log_prob_use_dynamic_bsz": _get(cfg, f"{F}.log_prob_use_dynamic_bsz", actor.use_dynamic_bsz),
        "log_prob_max_token_len_per_gpu": _get(cfg, f"{F}.log_prob_max_token_len_per_gpu", actor.ppo_max_token_len_per_gpu),
    })
    critic_ppo_micro = _get(cfg, "critic.ppo_micro_batch_size")
    critic_ppo_micro_gpu = _get(cfg, "critic.ppo_micro_batch_size_per_gpu")
    critic = Section({
        # ppo_trainer.yaml interpolations: critic.* = ${actor_rollout_ref.actor.*}, rollout_n = ${...rollout.n}
        "ppo_mini_batch_size": _get(cfg, "critic.ppo_mini_batch_size", actor.ppo_mini_batch_size),
        "ppo_epochs": _get(cfg, "critic.ppo_epochs", actor.ppo_epochs),
        "use_dynamic_bsz": _get(cfg, "critic.use_dynamic_bsz", actor.use_dynamic_bsz),
        "rollout_n": n,
        "ppo_micro_batch_size": critic_ppo_micro,
        "ppo_micro_batch_size_per_gpu": critic_ppo_micro_gpu,
        "forward_micro_batch_size": _get(cfg, "critic.forward_micro_batch_size", critic_ppo_micro),
        "forward_micro_batch_size_per_gpu": _get(cfg, "critic.forward_micro_batch_size_per_gpu", critic_ppo_micro_gpu),
        "ppo_max_token_len_per_gpu": _get(cfg, "critic.ppo_max_token_len_per_gpu"),
        "ulysses_sequence_parallel_size": _get(cfg, "critic.ulysses_sequence_parallel_size"),
    })
    critic.forward_max_token_len_per_gpu = _get(cfg, "critic.forward_max_token_len_per_gpu", critic.ppo_max_token_len_per_gpu)

    use_critic = _get(cfg, "algorithm.adv_estimator") == "gae"
    use_reference_policy = bool(actor.use_kl_loss or _get(cfg, "algorithm.use_kl_in_reward"))

    # --- verl/utils/config.py L87-113 validate_config ------------------------------------------
    real_train_batch_size = train_batch_size * n
    assert real_train_batch_size % n_gpus == 0, (
        f"real_train_batch_size ({real_train_batch_size}) must be divisible by total n_gpus ({n_gpus}).")
    # L117-143: deprecated and per-GPU micro batch sizes are mutually exclusive; one is needed without dynamic bsz.
    if not actor.use_dynamic_bsz:
        _check_mutually_exclusive(actor.ppo_micro_batch_size, actor.ppo_micro_batch_size_per_gpu, "actor_rollout_ref.actor")
        if use_reference_policy:
            _check_mutually_exclusive(ref.log_prob_micro_batch_size, ref.log_prob_micro_batch_size_per_gpu, "actor_rollout_ref.ref")
        _check_mutually_exclusive(rollout.log_prob_micro_batch_size, rollout.log_prob_micro_batch_size_per_gpu,
                                  "actor_rollout_ref.rollout")
    if use_critic and not critic.use_dynamic_bsz:
        _check_mutually_exclusive(critic.ppo_micro_batch_size, critic.ppo_micro_batch_size_per_gpu, "critic")

    # --- verl/workers/config/actor.py L200-221 ActorConfig.validate (and the critic's twin) --------
    for name, role, sp in (("actor", actor, actor.ulysses_sequence_parallel_size),
                           ("critic", critic if use_critic else None, critic.ulysses_sequence_parallel_size)):
        if role is None or role.use_dynamic_bsz:
            continue
        if train_batch_size < role.ppo_mini_batch_size:
            raise ValueError(f"train_batch_size ({train_batch_size}) must be >= {name}.ppo_mini_batch_size ({role.ppo_mini_batch_size})")
        if role.ppo_micro_batch_size is not None:
            if role.ppo_mini_batch_size % role.ppo_micro_batch_size != 0:
                raise ValueError(f"{name} ppo_mini_batch_size must be divisible by ppo_micro_batch_size")
            if role.ppo_micro_batch_size * sp < n_gpus:
                raise ValueError(f"{name} ppo_micro_batch_size * ulysses_sequence_parallel_size must be >= n_gpus")
    # FSDPActorConfig.validate: Ulysses needs padding removal (actor.py); critic.py L202-211 for the critic's model.
    if actor.ulysses_sequence_parallel_size > 1 and not _get(cfg, "actor_rollout_ref.model.use_remove_padding"):
        raise ValueError("When using sequence parallelism for actor/ref policy, you must enable `use_remove_padding`.")
    if use_critic and critic.ulysses_sequence_parallel_size > 1 and not _get(cfg, "critic.model.use_remove_padding"):
        raise ValueError("When using sequence parallelism for critic, you must enable `use_remove_padding`.")

    # --- verl/workers/fsdp_workers.py L240-262 ActorRolloutRefWorker.__init__ -------------------
    world = pools["actor"]
    sp = actor.ulysses_sequence_parallel_size
    # fsdp_workers.py L169-175: init_device_mesh(mesh_shape=(world // sp, sp)) needs sp | world
    assert world % sp == 0, f"ulysses sp {sp} does not divide the world size {world}"
    dp = world // sp
    actor.ppo_mini_batch_size *= rollout.n
    _floor_div(actor, "ppo_mini_batch_size", world // sp, floored, "actor.ppo_mini_batch_size")
    assert actor.ppo_mini_batch_size > 0, f"ppo_mini_batch_size {actor.ppo_mini_batch_size} should be larger than 0 after normalization"
    if actor.ppo_micro_batch_size is not None:
        _floor_div(actor, "ppo_micro_batch_size", world // sp, floored, "actor.ppo_micro_batch_size")
        actor.ppo_micro_batch_size_per_gpu = actor.ppo_micro_batch_size
    if actor.use_dynamic_bsz:
        # dynamic bsz: verl's yaml leaves the per-GPU micro batch null; packing ignores any value
        actor.ppo_micro_batch_size_per_gpu = None
    if actor.ppo_micro_batch_size_per_gpu is not None:
        assert actor.ppo_mini_batch_size % actor.ppo_micro_batch_size_per_gpu == 0, (
            f"normalized ppo_mini_batch_size {actor.ppo_mini_batch_size} should be divisible by "
            f"ppo_micro_batch_size_per_gpu {actor.ppo_micro_batch_size_per_gpu}")
        assert actor.ppo_mini_batch_size // actor.ppo_micro_batch_size_per_gpu > 0
    # L264-273: deprecated log-prob micro batches for rollout and ref, divided by the same world // sp
    if rollout.log_prob_micro_batch_size is not None:
        _floor_div(rollout, "log_prob_micro_batch_size", world // sp, floored, "rollout.log_prob_micro_batch_size")
        rollout.log_prob_micro_batch_size_per_gpu = rollout.log_prob_micro_batch_size
    if use_reference_policy and ref.log_prob_micro_batch_size is not None:
        ref_world = pools.get("ref", world)
        _floor_div(ref, "log_prob_micro_batch_size", ref_world // sp, floored, "ref.log_prob_micro_batch_size")
        ref.log_prob_micro_batch_size_per_gpu = ref.log_prob_micro_batch_size

    # L622-628: the rollout's tensor parallel size divides the world; replica.py L96-105: within a node.
    tp = rollout.tensor_model_parallel_size
    rollout_world = pools["rollout"]
    assert rollout_world % tp == 0, f"rollout world_size: {rollout_world} is not divisible by infer_tp: {tp}"
    # A resource pool is `[n_gpus_per_node] * nnodes` GPUs: a replica larger than a node takes whole nodes.
    rollout_per_node = _pool_gpus_per_node(cfg, "rollout")
    if tp > rollout_per_node:
        assert tp % rollout_per_node == 0, f"tensor_model_parallel_size {tp} must fill whole nodes of {rollout_per_node} GPUs"

    # --- what a training step then does (dp_actor.py L541-560) -----------------------------------
    sequences_per_gpu = real_train_batch_size // dp  # the batch is chunked over data-parallel ranks
    mini_batches = _split_count(sequences_per_gpu, actor.ppo_mini_batch_size)  # data.split(ppo_mini_batch_size)
    grad_accum = None
    if actor.ppo_micro_batch_size_per_gpu is not None:
        grad_accum = actor.ppo_mini_batch_size // actor.ppo_micro_batch_size_per_gpu
    if actor.use_dynamic_bsz:
        # seqlen_balancing.py L382-384: max_token_len = ppo_max_token_len_per_gpu * sp >= longest sequence
        assert actor.ppo_max_token_len_per_gpu * sp >= seq_len, (
            f"max_token_len must be greater than the sequence length. Got max_token_len={actor.ppo_max_token_len_per_gpu * sp} and max_seq_len={seq_len}")
    result = VerlResult(floored=floored)
    result.actor = {
        "dp_size": dp,
        "sequences_per_gpu": sequences_per_gpu,
        "ppo_mini_batch_size_per_gpu": actor.ppo_mini_batch_size,
        "ppo_micro_batch_size_per_gpu": actor.ppo_micro_batch_size_per_gpu,
        "grad_accum_steps": grad_accum,
        "optimizer_steps_per_train_step": actor.ppo_epochs * mini_batches,
    }

    log_prob_micro = None if rollout.log_prob_use_dynamic_bsz else rollout.log_prob_micro_batch_size_per_gpu
    if rollout.log_prob_use_dynamic_bsz:
        assert rollout.log_prob_max_token_len_per_gpu * sp >= seq_len, "rollout log-prob max_token_len below max_seq_len"
    result.rollout = {
        "replicas": rollout_world // tp,
        "sequences_per_replica": real_train_batch_size // (rollout_world // tp),
        "log_prob_micro_batch_size_per_gpu": log_prob_micro,
        "log_prob_micro_batches_per_gpu": None if log_prob_micro is None else _split_count(sequences_per_gpu, log_prob_micro),
    }

    if use_reference_policy:
        ref_world = pools.get("ref", world)
        ref_micro = None if ref.log_prob_use_dynamic_bsz else ref.log_prob_micro_batch_size_per_gpu
        if ref.log_prob_use_dynamic_bsz:
            assert ref.log_prob_max_token_len_per_gpu * sp >= seq_len, "ref max_token_len below max_seq_len"
        ref_seqs = real_train_batch_size // (ref_world // sp)
        result.ref = {
            "micro_batch_size_per_gpu": ref_micro,
            "micro_batches_per_gpu": None if ref_micro is None else _split_count(ref_seqs, ref_micro),
        }

    # --- verl/workers/fsdp_workers.py L1231-1252 CriticWorker.__init__ ---------------------------
    if use_critic:
        c_world = pools["critic"]
        c_sp = critic.ulysses_sequence_parallel_size
        assert c_world % c_sp == 0, f"critic ulysses sp {c_sp} does not divide the world size {c_world}"
        c_dp = c_world // c_sp
        critic.ppo_mini_batch_size *= critic.rollout_n
        _floor_div(critic, "ppo_mini_batch_size", c_world // c_sp, floored, "critic.ppo_mini_batch_size")
        if critic.ppo_micro_batch_size is not None:
            _floor_div(critic, "ppo_micro_batch_size", c_world // c_sp, floored, "critic.ppo_micro_batch_size")
            _floor_div(critic, "forward_micro_batch_size", c_world // c_sp, floored, "critic.forward_micro_batch_size")
            critic.ppo_micro_batch_size_per_gpu = critic.ppo_micro_batch_size
            critic.forward_micro_batch_size_per_gpu = critic.forward_micro_batch_size
        if critic.use_dynamic_bsz:
            critic.ppo_micro_batch_size_per_gpu = critic.forward_micro_batch_size_per_gpu = None
        if critic.ppo_micro_batch_size_per_gpu is not None:
            assert critic.ppo_mini_batch_size % critic.ppo_micro_batch_size_per_gpu == 0, (
                f"normalized critic ppo_mini_batch_size {critic.ppo_mini_batch_size} should be divisible by "
                f"ppo_micro_batch_size_per_gpu {critic.ppo_micro_batch_size_per_gpu}")
            assert critic.ppo_mini_batch_size // critic.ppo_micro_batch_size_per_gpu > 0
        if critic.use_dynamic_bsz:
            assert critic.ppo_max_token_len_per_gpu * c_sp >= seq_len, "critic max_token_len below max_seq_len"
            assert critic.forward_max_token_len_per_gpu * c_sp >= seq_len, "critic forward max_token_len below max_seq_len"
        c_seqs = real_train_batch_size // c_dp
        fwd = critic.forward_micro_batch_size_per_gpu
        result.critic = {
            "dp_size": c_dp,
            "sequences_per_gpu": c_seqs,
            "ppo_mini_batch_size_per_gpu": critic.ppo_mini_batch_size,
            "ppo_micro_batch_size_per_gpu": critic.ppo_micro_batch_size_per_gpu,
            "grad_accum_steps": (None if critic.ppo_micro_batch_size_per_gpu is None
                                 else critic.ppo_mini_batch_size // critic.ppo_micro_batch_size_per_gpu),
            "optimizer_steps_per_train_step": critic.ppo_epochs * _split_count(c_seqs, critic.ppo_mini_batch_size),
            "forward_micro_batch_size_per_gpu": fwd,
            "forward_micro_batches_per_gpu": None if fwd is None else _split_count(c_seqs, fwd),
        }
    return result


def verl_served_reward_model_replicas(plan: dict) -> int | None:
    """verl 0.9.1's replicas of a served reward model (None: none served): main_ppo_v0.init_resource_pool_mgr
    gives it the trainer's nnodes × n_gpus_per_node when colocated (a reward_pool of its own otherwise, both > 0),
    and reward_loop/reward_model.py `_initialize_llm_servers` serves world_size // (tp × dp × pp) replicas."""
    cfg = copy.deepcopy(plan)
    if not _get(cfg, "reward_model.enable", False) or _get(cfg, "reward_model.use_reward_loop", True) is False:
        return None
    if _get(cfg, "reward_model.rollout.name") is None:
        return None
    if _get(cfg, "reward_model.enable_resource_pool", False):
        nnodes, per_node = _get(cfg, "reward_model.nnodes", 0), _get(cfg, "reward_model.n_gpus_per_node", 8)
        if per_node <= 0 or nnodes <= 0:
            raise ValueError("config.reward.reward_model.n_gpus_per_node and nnodes must be greater than 0")
        world_size = nnodes * per_node
    else:
        world_size = _get(cfg, "trainer.nnodes") * _get(cfg, "trainer.n_gpus_per_node")
    rollout_world_size = _get(cfg, "reward_model.rollout.tensor_model_parallel_size", 2)
    replicas = world_size // rollout_world_size
    assert replicas > 0, "Not enough GPUs to run the reward model."
    return replicas
