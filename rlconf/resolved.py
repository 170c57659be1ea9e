"""The resolved plan: the frozen, JSON-serializable contract between the compiler and the engine.

Everything the engine needs is here: the validated config (defaults filled) and every derived
per-GPU number with its formula. Workers read these values; they never re-derive them.
Documented field by field in docs/resolved-plan.md. Bump SCHEMA_VERSION on any breaking change.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from rlconf import __version__
from rlconf.diagnostics import Diagnostic
from rlconf.estimate import PhaseEstimate
from rlconf.modelinfo import ModelInfo, source_text
from rlconf.normalize import ForwardPass, Normalized, Q, RolloutPlan, TrainPass
from rlconf.reward_loop import ServedRewardModel
from rlconf.rewards import reward_text
from rlconf.schema import PlanConfig

SCHEMA_VERSION = 1


class Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class World(Frozen):
    nnodes: int
    gpus_per_node: int
    world_size: int
    device: str


class PoolView(Frozen):
    nnodes: int
    gpus_per_node: int
    gpus: int
    roles: list[str]


class PlacementView(Frozen):
    pools: dict[str, PoolView]
    roles: dict[str, str]


class ScheduleView(Frozen):
    mode: Literal["colocated_sync", "one_step_off_policy", "fully_async"]  # rlconf.normalize.schedule
    why: str
    max_staleness: int
    weight_sync: Literal["in_process", "nccl", "gloo"]
    bucket_megabytes: int
    trainer_gpus: int
    rollout_gpus: int
    total_gpus: int
    # fully_async (verl's async_training.*; rlconf.normalize.fully_async_sizes), 0 in the other modes
    sync_every: int = 1
    groups_per_step: int = 0
    max_groups_per_version: int = 0
    replica_share: int = 0
    replica_window: int = 0
    partial_rollout: bool = False
    formulas: dict[str, str] = {}

    @property
    def off_policy(self) -> bool:
        """Rollout on a pool of its own (either off-policy schedule)."""
        return self.mode in ("one_step_off_policy", "fully_async")

    @property
    def fully_async(self) -> bool:
        return self.mode == "fully_async"


class ForwardRole(Frozen):
    pool: str
    world_size: int
    sp_size: int
    dp_size: int
    sequences_per_gpu: int
    use_dynamic_bsz: bool
    micro_batch_size_per_gpu: int | None
    micro_batches_per_gpu: int | None
    max_token_len_per_gpu: int
    tokens_per_micro_batch: int
    formulas: dict[str, str]


class TrainRole(Frozen):
    pool: str
    world_size: int
    sp_size: int
    dp_size: int
    sequences_per_gpu: int
    ppo_mini_batch_size: int
    ppo_mini_batch_size_per_gpu: int
    use_dynamic_bsz: bool
    ppo_micro_batch_size_per_gpu: int | None
    grad_accum_steps: int | None
    mini_batches_per_epoch: int
    ppo_epochs: int
    optimizer_steps_per_train_step: int
    max_token_len_per_gpu: int
    tokens_per_micro_batch: int
    formulas: dict[str, str]


class RolloutRole(Frozen):
    pool: str
    backend: str
    tensor_parallel_size: int
    replicas: int
    n: int
    prompts_per_step: int
    sequences_per_step: int
    prompts_per_generation: int  # data.gen_batch_size (default train_batch_size): prompts of one generation round
    sequences_per_generation: int
    sequences_per_replica: int  # of one generation round
    prompt_length: int
    response_length: int
    max_model_len: int
    gpu_memory_utilization: float
    max_num_seqs: int
    max_num_batched_tokens: int
    log_prob: ForwardRole
    old_log_probs: Literal["recompute", "update", "rollout"]  # rlconf.normalize.old_log_prob_source
    old_log_probs_why: str
    log_probs: bool  # the engine returns each sampled token's log-prob (rlconf.normalize.rollout_log_prob_need)
    log_probs_why: str
    formulas: dict[str, str]


class ServedRewardModelRole(Frozen):
    """verl 0.9.1's reward loop: the reward model served by a rollout engine (rlconf.reward_loop)."""

    pool: str
    backend: str
    colocated: bool  # on the actor's pool (asleep while it trains) or on a pool of its own
    world_size: int
    tensor_parallel_size: int
    replicas: int
    gpu_memory_utilization: float
    free_cache_engine: bool
    max_model_len: int | None  # None: the model's max_position_embeddings
    formulas: dict[str, str]


class Roles(Frozen):
    actor: TrainRole
    rollout: RolloutRole
    ref: ForwardRole | None = None
    critic: TrainRole | None = None
    critic_values: ForwardRole | None = None
    reward_model: ForwardRole | None = None
    served_reward_model: ServedRewardModelRole | None = None


class MemoryTerm(Frozen):
    what: str
    gib: float
    formula: str


class MemoryPhase(Frozen):
    pool: str
    phase: str
    total_gib: float
    gpu_memory_gib: float
    terms: list[MemoryTerm]


class ModelView(Frozen):
    path: str
    info_source: str | None  # rlconf.modelinfo.ModelInfo.source
    num_params: float | None
    model_type: str | None
    info_text: str | None = None  # the same in words, with the file or table entry it names


class RewardView(Frozen):
    manager: str  # reward_model.reward_manager (engine/rewards/managers.py)
    source: Literal["reward_model", "scorer"]  # the reward model's scores, or the manager's scorer
    text: str  # the same in words (rlconf.rewards.reward_text)


class ResolvedPlan(Frozen):
    schema_version: int
    rlconf_version: str
    source: dict[str, Any]  # {"files": [...], "overrides": [...]}
    world: World
    placement: PlacementView
    schedule: ScheduleView
    model: ModelView
    roles: Roles
    memory: list[MemoryPhase]
    diagnostics: list[dict[str, Any]]
    config: PlanConfig
    reward: RewardView | None = None  # None only in plans written before rlconf stated it


def _split(obj: Any, pool: str, drop: tuple[str, ...] = ()) -> dict[str, Any]:
    """A normalization record (a NamedTuple) -> plain values + formulas (Q fields carry both);
    nested records (a rollout's log-prob pass) are left out."""
    values: dict[str, Any] = {"pool": pool}
    formulas: dict[str, str] = {}
    for name in obj._fields:
        if name in drop:
            continue
        v = getattr(obj, name)
        if isinstance(v, Q):
            values[name] = v.value
            formulas[name] = v.formula
        elif not hasattr(v, "_fields"):
            values[name] = v
    values["formulas"] = formulas
    return values


def _forward(p: ForwardPass, pool: str) -> ForwardRole:
    data = _split(p, pool, drop=("role", "micro_key", "deprecated_micro"))
    data["world_size"] = data.pop("pool_gpus")
    data["micro_batch_size_per_gpu"] = data.get("micro_batch_size_per_gpu")
    return ForwardRole(**data)


def _train(p: TrainPass, pool: str) -> TrainRole:
    data = _split(p, pool, drop=("role", "deprecated_micro"))
    data["world_size"] = data.pop("pool_gpus")
    return TrainRole(**data)


def _rollout(r: RolloutPlan, pool: str, plan: PlanConfig) -> RolloutRole:
    data = _split(r, pool, drop=("log_prob",))
    data["pool_gpus"] = None
    data.pop("pool_gpus")
    rollout = plan.actor_rollout_ref.rollout
    return RolloutRole(**data, gpu_memory_utilization=rollout.gpu_memory_utilization, max_num_seqs=rollout.max_num_seqs,
                       max_num_batched_tokens=rollout.max_num_batched_tokens, log_prob=_forward(r.log_prob, pool))


def _served(s: ServedRewardModel) -> ServedRewardModelRole:
    return ServedRewardModelRole(
        pool=s.pool, backend=s.backend, colocated=s.colocated, world_size=s.pool_gpus,
        tensor_parallel_size=s.tensor_parallel_size, replicas=s.replicas, gpu_memory_utilization=s.gpu_memory_utilization,
        free_cache_engine=s.free_cache_engine, max_model_len=s.max_model_len,
        formulas={"world_size": s.pool_formula, "replicas": s.replicas_formula})


def build_resolved(plan: PlanConfig, norm: Normalized, model: ModelInfo | None, memory: list[PhaseEstimate],
                   diagnostics: list[Diagnostic], files: list[str], overrides: list[str]) -> ResolvedPlan:
    t = plan.trainer
    where = norm.placement
    roles_of: dict[str, list[str]] = {name: [] for name in where.pools}
    role_pools = dict(where.roles)
    pools = {name: PoolView(nnodes=p.nnodes, gpus_per_node=p.gpus_per_node, gpus=p.gpus, roles=[])
             for name, p in where.pools.items()}
    served = norm.served_reward_model
    if served is not None:
        role_pools["reward_model"] = served.pool
        if not served.colocated:  # verl's reward_pool: GPUs beside the trainer's
            rm = plan.reward_model
            pools[served.pool] = PoolView(nnodes=rm.nnodes, gpus_per_node=rm.n_gpus_per_node, gpus=served.pool_gpus,
                                          roles=[])
    for role, pool in role_pools.items():
        roles_of.setdefault(pool, []).append(role)
    placement = PlacementView(
        pools={name: view.model_copy(update={"roles": roles_of.get(name, [])}) for name, view in pools.items()},
        roles=role_pools)
    pool = where.roles.get
    roles = Roles(
        actor=_train(norm.actor, pool("actor")),
        rollout=_rollout(norm.rollout, pool("rollout"), plan),
        ref=_forward(norm.ref, pool("ref")) if norm.ref else None,
        critic=_train(norm.critic, pool("critic")) if norm.critic else None,
        critic_values=_forward(norm.critic_values, pool("critic")) if norm.critic_values else None,
        reward_model=_forward(norm.reward_model, pool("reward_model")) if norm.reward_model else None,
        served_reward_model=_served(served) if served is not None else None,
    )
    gpu_gib = plan.estimate.gpu_memory_gib
    memory_view = [MemoryPhase(pool=m.pool, phase=m.phase, total_gib=round(m.total_gib, 6), gpu_memory_gib=gpu_gib,
                               terms=[MemoryTerm(what=x.what, gib=round(x.gib, 6), formula=x.formula) for x in m.terms])
                   for m in memory]
    return ResolvedPlan(
        schema_version=SCHEMA_VERSION,
        rlconf_version=__version__,
        source={"files": files, "overrides": list(overrides)},
        world=World(nnodes=t.nnodes, gpus_per_node=t.n_gpus_per_node, world_size=t.nnodes * t.n_gpus_per_node, device=t.device),
        placement=placement,
        schedule=ScheduleView(**norm.schedule._asdict()),
        model=ModelView(path=plan.actor_rollout_ref.model.path, info_source=model.source if model else None,
                        num_params=model.num_params if model else None, model_type=model.model_type if model else None,
                        info_text=source_text(model, bool(plan.estimate.num_params_b)) if model else None),
        roles=roles,
        memory=memory_view,
        diagnostics=[d.to_json() for d in diagnostics],
        config=plan,
        reward=RewardView(manager=plan.reward_model.reward_manager,
                          source="reward_model" if plan.reward_model.enable else "scorer", text=reward_text(plan)),
    )
