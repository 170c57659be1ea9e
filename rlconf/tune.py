"""`rlconf tune`: verl's performance tuning guide as a search over the per-GPU knobs, before a GPU is touched.

The training stays the same: every algorithmic number (train_batch_size, ppo_mini_batch_size, n,
epochs, lengths, the model) is kept, and only the knobs the guide tunes move. Each candidate is
compiled like any plan (rlconf.compile: the same rules, normalization and memory estimate), so a
tuned plan is one `rlconf validate` accepts, and "fits" means the estimate's peak of every pool and
phase, times SAFETY (the estimate's measured spread against real peaks, docs/benchmarks.md), stays
within the GPU.

The guide's order:
1. packing (use_remove_padding) for model families that support it, gradient checkpointing on
   ("to afford larger micro batches"), dynamic batch size in every role;
2. the actor's token budget: the largest multiple of one full sequence (prompt + response), at
   least 2×, that fits, up to a whole mini batch per GPU (beyond that nothing is gained); with packed
   rows only the balanced micro batch sizes the engine runs;
3. forward-only budgets 2× the training ones (log-probs, reference, critic values, reward model),
   the critic's and reward model's 2× the actor's;
4. the rollout's gpu_memory_utilization as high as the other phase's residents leave room for
   (0.7 at most with the actor's states on the GPU: RL602), max_num_batched_tokens above 2048, max_num_seqs
   down to what a replica has in flight;
5. only when the plan does not fit otherwise: the actor's budget down to one sequence, chunked
   entropy, parameter and optimizer offload, Ulysses, and the budgets again once a step made room; or one
   answer saying what cannot fit and why.

Between candidates that fit, the throughput model (rlconf/tune_costs.py: per-knob cost terms measured on
GPUs, in rlconf/tune_costs.json with their provenance) decides where it has measured terms: the budget
whose measured training time per token is within TOLERANCE of the best (the smallest such: memory left
over; the curve read only inside its measured range), the lowest gpu_memory_utilization whose measured
generate time is within TOLERANCE of the best; checkpointing off, chunked entropy, compiled layers, vLLM's
async scheduling, vLLM in processes of its own (mp) or vLLM kept awake beside the actor when measured faster by
more than the profile's tolerance:
TOLERANCE or, when larger, the
spread the profile measured between repeats of the same knobs (a factor inside their scatter decides
nothing). Without a
measured profile (the file as shipped until a bench writes one) the guide's rule decides alone, "largest
that fits", and the output says so.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field
from typing import Any, Literal

from rlconf.compile import CompileResult, compile_plan
from rlconf.diagnostics import Diagnostic
from rlconf.loss_head import plan_loss_head_kernels
from rlconf.modelinfo import model_info
from rlconf.tune_costs import TOLERANCE, CostFileError, CostTable, Profile, load_costs

# The estimate is within ±15% of measured peaks on most configurations (docs/benchmarks.md): a plan
# "fits" when its estimate × 1.15 stays within the GPU.
SAFETY = 1.15
# gpu_memory_utilization bounds: verl's guide says 0.5-0.7 with the actor's states on the GPU (RL602
# warns above 0.7); vLLM needs room for its weights and some KV cache at the low end.
UTILIZATION_STEP, UTILIZATION_MIN, UTILIZATION_MAX, UTILIZATION_MAX_OFFLOADED = 0.05, 0.3, 0.7, 0.9
MIN_BATCHED_TOKENS = 8192  # RL601: above 2048; vLLM's own default for chunked prefill
# A profile stands for model sizes up to this factor from its own: the share of a step that is kernel-launch bound
# (what checkpointing, compiled layers or a micro batch's size trade against) changes with the size. 8×, not the
# first 4×: at 3.09B on 2 H100s (2026-11-28, docs/benchmarks.md) the compiled layers' training passes took ×0.80
# of the eager ones at the same micro batch, against ×0.77 in the 0.5B profile, 6.2× smaller (two launches, not
# paired rounds, inside the profile's 12% spread: the direction held); beyond 8× nothing was compared.
PROFILE_REACH = 8.0
MEASURE_HINT = "bench/tune_training_costs.py and bench/tune_generate_costs.py measure one (docs/tune.md)"
# vLLM captures a CUDA graph for every batch size up to max_num_seqs, in steps of 8 past 8 (1, 2, 4, 8, 16, 24, ...).
GRAPH_BATCH_STEP = 8

Objective = Literal["throughput", "memory"]


@dataclass(frozen=True)
class Change:
    key: str
    before: Any
    after: Any
    why: str


@dataclass(frozen=True)
class Considered:
    """A knob the tuner weighed (the throughput model, or a step like _keep_awake) and left as the plan has it, and
    why."""
    key: str
    value: Any  # what was weighed
    why: str


@dataclass
class TuneResult:
    gpu_memory_gib: float
    gpu_source: str  # where the GPU's memory came from, in words
    limit_gib: float  # what the estimate may reach: the GPU ÷ SAFETY
    before: CompileResult
    after: CompileResult | None = None
    changes: list[Change] = field(default_factory=list)
    considered: list[Considered] = field(default_factory=list)
    fits: bool = False
    why_not: str | None = None  # when nothing fits: the smallest peak, what dominates it, what would help
    throughput_state: str = "unmeasured"  # "measured" (a profile decided), "unmeasured", "unreadable"
    throughput_note: str = ""  # the throughput model's state in words: which profile, or why none

    @property
    def overrides(self) -> list[str]:
        return [f"{c.key}={_yaml(c.after)}" for c in self.changes]


def _yaml(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def peak(result: CompileResult) -> float:
    """The largest estimated GiB of any pool and phase (0 when the estimate is empty)."""
    memory = result.resolved.memory if result.resolved is not None else []
    return max((phase.total_gib for phase in memory), default=0.0)


def _setting(config: Any, dotted: str) -> Any:
    node = config
    for part in dotted.split("."):
        node = node.get(part) if isinstance(node, dict) else getattr(node, part)  # engine_kwargs.vllm is a dict
    return node


class _Search:
    """The plan as it is tuned: the user's overrides, then the tuner's, each compiled when asked."""

    def __init__(self, path: str | os.PathLike, overrides: list[str], gpu_gib: float,
                 profile: Profile | None = None) -> None:
        self.path = path
        self.profile = profile  # the measured throughput model, or None: the guide's order alone
        self.base = [*overrides, f"estimate.gpu_memory_gib={gpu_gib:g}"]
        self.tuned: dict[str, Any] = {}
        self.why: dict[str, str] = {}
        self.considered: list[Considered] = []  # knobs the search weighed and left as they were
        self.limit = gpu_gib / SAFETY
        self.original = self.compile({})

    def compile(self, extra: dict[str, Any]) -> CompileResult:
        knobs = {**self.tuned, **extra}
        return compile_plan(self.path, [*self.base, *(f"{k}={_yaml(v)}" for k, v in knobs.items())])

    def fits(self, result: CompileResult) -> bool:
        """Every phase's estimate within the limit, and vLLM's share holding its weights and a KV cache (RL611:
        weights beyond the share are an engine that does not start, whatever the phases add up to)."""
        return result.resolved is not None and peak(result) <= self.limit and vllm_share_short(result) is None

    def batches_fit(self, result: CompileResult) -> bool:
        """The training phases fit: the only ones the batch knobs change. vLLM's share of the rollout phase is
        chosen afterwards (_rollout) from what its other residents leave, and a served reward model's phase
        holds states and a reservation no budget moves; judging a budget by either would leave the guide's
        floor for no reason (what they need is _rollout's or the fallbacks' to give)."""
        return result.resolved is not None and max(
            (p.total_gib for p in result.resolved.memory if p.phase == "training"), default=0.0) <= self.limit

    def set(self, key: str, value: Any, why: str) -> None:
        if _setting(self.original.config, key) == value:  # back to (or already at) what the plan says
            self.tuned.pop(key, None)
            self.why.pop(key, None)
            return
        self.tuned[key] = value
        self.why[key] = why

    def value(self, key: str) -> Any:
        """The knob as the search has it now: the tuner's value, else the plan's."""
        return self.tuned[key] if key in self.tuned else _setting(self.original.config, key)

    def current(self) -> CompileResult:
        return self.compile({})


def tune(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (), gpu_memory_gib: float | None = None,
         gpu_source: str | None = None, objective: Objective = "throughput", dynamic: bool = True,
         costs: CostTable | str | os.PathLike | None = None) -> TuneResult:
    """Search the per-GPU knobs of the plan at `path` for a GPU of `gpu_memory_gib` (None: the plan's own
    estimate.gpu_memory_gib). The result's `after` is the tuned plan compiled, `changes` what moved.

    `dynamic` False keeps fixed micro batches (the guide's step before dynamic batch size): the
    largest micro batch per GPU that divides the normalized mini batch and fits, forward-only ones 2×.
    `costs`: the throughput model's cost table (default rlconf/tune_costs.json).
    """
    first = compile_plan(path, list(overrides))
    if first.resolved is None:
        return TuneResult(0.0, "", 0.0, first, why_not="the plan has errors: fix them first (rlconf validate)")
    gib = gpu_memory_gib if gpu_memory_gib is not None else first.config.estimate.gpu_memory_gib
    source = gpu_source or ("estimate.gpu_memory_gib of the plan" if gpu_memory_gib is None else "--gpu-memory")
    state, note, profile = _throughput_model(costs, first)
    search = _Search(path, list(overrides), gib, profile if objective == "throughput" else None)
    result = TuneResult(gib, source, search.limit, search.original, throughput_state=state, throughput_note=note)
    if not search.original.resolved.memory:
        result.why_not = ("the memory estimate is empty: rlconf does not know the model's size (point model.path at "
                          "a local HF directory, or set estimate.num_params_b)")
        return result
    _structure(search, dynamic)
    if dynamic:
        _budgets(search, objective)
        _measured_trades(search, objective)
    else:
        _micro_batches(search, objective)
    _rollout(search)
    _fully_async_calls(search)
    if not search.fits(search.current()):
        _fallbacks(search)
        if search.fits(search.current()):
            _rechoose_batches(search, dynamic, objective)
    _keep_awake(search, objective)
    after = search.current()
    result.after = after
    result.fits = search.fits(after)
    config = search.original.config
    result.changes = [Change(key, _setting(config, key), value, search.why[key]) for key, value in search.tuned.items()]
    result.considered = [c for c in search.considered if c.key not in search.tuned]
    if not result.fits:
        result.why_not = _why_not(after, search.limit, gib) + _host_offload_hint(search)
    return result


def _host_offload_hint(search: _Search) -> str:
    """Where FSDP2's offload_policy would make the plan fit: what it needs of the hosts, which no plan says.

    Not one of the tuner's fallbacks: it keeps fp32 parameters, gradients and Adam moments in host memory (16 B
    a parameter over the shards, every GPU of a node adding its own) and runs the optimizer step on the CPU, and
    rlconf knows nothing of the hosts' memory (7B on one GPU: about 114 GiB, of a 128 GiB host, 2026-11-27)."""
    config = search.original.config
    keys = ["actor_rollout_ref.actor.fsdp_config.offload_policy"]
    if search.original.normalized.critic is not None:
        keys.append("critic.model.fsdp_config.offload_policy")
    if all(search.value(key) for key in keys):
        return ""
    result = search.compile({key: True for key in keys})
    info = model_info(config.actor_rollout_ref.model.path, config.estimate.num_params_b)
    if not search.fits(result) or info is None or not info.num_params:
        return ""
    shards = search.original.normalized.actor.pool_gpus
    host = 16 * info.num_params / shards * min(shards, config.trainer.n_gpus_per_node) / 2**30
    return (f". With FSDP2's offload_policy ({', '.join(f'`{key}=true`' for key in keys)}: parameters, gradients "
            f"and Adam moments in host memory, the optimizer step on the CPU) it would fit at {peak(result):.1f} GiB "
            f"per GPU, but each node would hold about {host:.0f} GiB of the actor's states in host memory (16 B a "
            "parameter over the shards), which rlconf cannot check: set it yourself where the hosts have it")


def _structure(search: _Search, dynamic: bool = True) -> None:
    """Packing, checkpointing and dynamic batch size: the guide's switches, in every role the plan has."""
    norm, config = search.original.normalized, search.original.config
    info = model_info(config.actor_rollout_ref.model.path, config.estimate.num_params_b)
    family = info.family if info is not None else None  # the families whose HF models take packed rows
    roles = [("actor_rollout_ref.model", True), ("critic.model", norm.critic is not None),
             ("reward_model.model", norm.reward_model is not None)]
    if family is not None:
        for section, present in roles:
            if present:
                search.set(f"{section}.use_remove_padding", True,
                           f"packing: {family} models run packed rows (the guide's remove-padding tip)")
    search.set("actor_rollout_ref.model.enable_gradient_checkpointing", True,
               "checkpointing affords larger micro batches (the guide's first batch-size tip)")
    if norm.critic is not None:
        search.set("critic.model.enable_gradient_checkpointing", True, "as the actor's")
    if not dynamic:
        fixed = "fixed micro batches asked for (--fixed-micro-batches)"
        search.set("actor_rollout_ref.actor.use_dynamic_bsz", False, fixed)
        for key, present in (("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", norm.rollout.log_prob is not None),
                             ("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", norm.ref is not None),
                             ("critic.use_dynamic_bsz", norm.critic is not None),
                             ("reward_model.use_dynamic_bsz", norm.reward_model is not None)):
            if present and _setting(config, key):
                search.set(key, False, fixed)
        return
    dynamic = "dynamic batch size: micro batches filled to a token budget (the guide's higher-throughput tip)"
    search.set("actor_rollout_ref.actor.use_dynamic_bsz", True, dynamic)
    if config.actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu is not None:
        search.set("actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", None, "ignored with dynamic batch size (RL403)")
    # The log-prob passes inherit the actor's switch unless the plan turned theirs off.
    if norm.rollout.log_prob is not None and config.actor_rollout_ref.rollout.log_prob_use_dynamic_bsz is False:
        search.set("actor_rollout_ref.rollout.log_prob_use_dynamic_bsz", True, dynamic)
    if norm.ref is not None and config.actor_rollout_ref.ref.log_prob_use_dynamic_bsz is False:
        search.set("actor_rollout_ref.ref.log_prob_use_dynamic_bsz", True, dynamic)
    if norm.critic is not None:
        if config.critic.use_dynamic_bsz is False:
            search.set("critic.use_dynamic_bsz", True, dynamic)
        if config.critic.ppo_micro_batch_size_per_gpu is not None:
            search.set("critic.ppo_micro_batch_size_per_gpu", None, "ignored with dynamic batch size (RL403)")
    if norm.reward_model is not None and config.reward_model.use_dynamic_bsz is False:
        search.set("reward_model.use_dynamic_bsz", True, dynamic)


def _budgets(search: _Search, objective: Objective) -> None:
    """Token budgets: the actor's largest that fits, the others by the guide's ratios."""
    norm = search.original.normalized
    seq = norm.rollout.prompt_length.value + norm.rollout.response_length.value
    mini_tokens = search.original.resolved.roles.actor.ppo_mini_batch_size_per_gpu * seq
    sp = max(norm.actor.sp_size, 1)
    # Budgets are per GPU; with Ulysses a micro batch's row is split over sp ranks.
    floor = math.ceil(2 * seq / sp)
    ceiling = max(floor, math.ceil(mini_tokens / sp))
    rows = search.original.resolved.roles.actor.ppo_mini_batch_size_per_gpu
    balanced = sp == 1 and bool(search.value("actor_rollout_ref.model.use_remove_padding")) and rows > 0
    if objective == "memory":
        candidates = [floor]
    elif balanced:
        # Packed rows: the engine cuts a mini batch into the fewest micro batches the budget allows and balances
        # them (engine/workers/passes/micro_batches.py), so full-length rows run ⌈rows ÷ count⌉ at a time. Budgets
        # of exactly those sizes: the estimate (which counts the budget) is then what full rows use, and no
        # budget sits above a balanced size it never fills.
        candidates = sorted({max(floor, -(-rows // count) * seq) for count in range(1, rows + 1)})
    else:
        candidates = sorted({min(k * seq // sp, ceiling) for k in range(2, max(2, -(-ceiling * sp // seq)) + 1)})
    chosen = None
    for budget in reversed(candidates):
        if search.batches_fit(search.compile(_budget_knobs(search, budget))):
            chosen = budget
            break
    measured_why = None
    if chosen is not None and search.profile is not None and search.profile.training_s_per_ktoken:
        # Memory grows with the budget: every candidate up to the largest that fits fits too.
        fitting = [b for b in candidates if b <= chosen]
        chosen, measured_why = _fastest_budget(search.profile, fitting, seq, sp)
    if chosen is None:
        chosen = floor  # the fallbacks below look for room; the guide's floor stays
        why = f"the guide's floor, 2 × (prompt + response) = {2 * seq} tokens{f' ÷ sp {sp}' if sp > 1 else ''}"
    elif measured_why is not None:
        why = measured_why
    elif chosen >= ceiling:
        why = f"a whole mini batch per GPU ({mini_tokens} tokens) fits in one micro batch"
    elif objective == "memory":
        why = f"--objective memory: the guide's floor, 2 × (prompt + response) = {2 * seq}"
    elif balanced:
        count = -(-rows // (chosen // seq))
        why = (f"{chosen // seq} full rows a micro batch: the mini batch's {rows} rows a GPU in {count} balanced micro "
               f"batches, the fewest whose estimate fits {search.limit:.1f} GiB")
    else:
        why = f"the largest multiple of one sequence ({seq} tokens) whose estimate fits {search.limit:.1f} GiB"
    for key, value in _budget_knobs(search, chosen).items():
        search.set(key, value, why if key == "actor_rollout_ref.actor.ppo_max_token_len_per_gpu" else
                   _RATIO_WHY.get(key, "the guide's ratio to the actor's budget"))


def _fastest_budget(profile: Profile, fitting: list[int], seq: int, sp: int) -> tuple[int, str]:
    """The smallest fitting budget whose measured training time per token is within tolerance of the best.

    The curve is read only inside its measured range: beyond it it repeats its end values, which says nothing.
    When a fitting budget lies above the largest measured micro batch, or every one below the smallest, the
    guide's rule decides (the largest that fits)."""
    measured = [x for x, _ in profile.training_s_per_ktoken]
    largest = max(fitting)
    if largest * sp / seq > max(measured) or largest * sp / seq < min(measured):
        return largest, (f"the largest multiple of one sequence ({seq} tokens) that fits (the guide's rule: the "
                         f"throughput model measured micro batches of {min(measured):g} to {max(measured):g} "
                         f"sequences, not {largest * sp // seq}; {_model_ref(profile)})")
    fitting = [b for b in fitting if b * sp / seq >= min(measured)]
    times = {b: profile.training_time(b * sp / seq) for b in fitting}
    best = min(times.values())
    # TOLERANCE, not the launches' spread: this reads one fitted curve (its points 4× apart), and a wider
    # tolerance would trade measured speed for memory the training phase cannot lend to anything else.
    chosen = min(b for b, t in times.items() if t <= best * (1 + TOLERANCE))
    if chosen == largest:
        return chosen, (f"the largest multiple of one sequence ({seq} tokens) that fits; measured training time per "
                        f"token is lowest there ({_model_ref(profile)})")
    return chosen, (f"{chosen * sp // seq} sequences a micro batch: measured training time per token within "
                    f"{TOLERANCE:.0%} of the best budget that fits ({largest} tokens), with memory to spare "
                    f"({_model_ref(profile)})")


def _model_ref(profile: Profile, generation: bool = False) -> str:
    """The profile a choice rests on; a generation choice names the profile its terms came from."""
    source = profile.generation_from if generation and profile.generation_from is not None else profile
    return f"throughput model: {source.model}, {source.device}"


def _measured_trades(search: _Search, objective: Objective) -> None:
    """Checkpointing off, chunked entropy: each kept when the measured model says the plan with it (and the
    budget it lets fit) trains faster than without. Unmeasured factors leave the guide's choice."""
    profile = search.profile
    if profile is None or not profile.training_s_per_ktoken or objective != "throughput":
        return
    norm = search.original.normalized
    seq = norm.rollout.prompt_length.value + norm.rollout.response_length.value
    sp = max(norm.actor.sp_size, 1)
    key = "actor_rollout_ref.actor.ppo_max_token_len_per_gpu"
    trades = [("checkpointing_off_factor", {"actor_rollout_ref.model.enable_gradient_checkpointing": False},
               "checkpointing off")]
    if search.original.config.trainer.device == "cuda":  # measured on GPUs; on CPU a compile costs more than it saves
        trades.append(("compile_layers_factor", {"actor_rollout_ref.model.compile_layers": True},
                       "each decoder layer compiled (compile_layers)"))
    if not _triton_head(search):
        trades.append(("entropy_chunking_factor", {"actor_rollout_ref.actor.entropy_from_logits_with_chunking": True},
                       "chunked entropy"))
    for factor_name, knobs, what in trades:
        factor = profile.factor(factor_name)
        if factor is None or all(search.value(k) == v for k, v in knobs.items()):
            continue
        now_budget = search.value(key)
        now = profile.training_time(now_budget * sp / seq)
        saved = (dict(search.tuned), dict(search.why))
        for k, v in knobs.items():
            search.set(k, v, what)
        _budgets(search, objective)
        budget = search.value(key)
        trial = search.current()
        fits = search.batches_fit(trial)
        predicted = profile.training_time(budget * sp / seq) * factor
        tolerance = profile.tolerance("training")
        if fits and predicted < now * (1 - tolerance):
            for k in knobs:
                if k in search.tuned:
                    search.why[k] = (f"{what}: measured ×{factor:.2f} training time; with a budget of {budget} "
                                     f"tokens predicted {predicted / now:.2f}× the time of {now_budget} without "
                                     f"({_model_ref(profile)})")
        else:
            search.tuned, search.why = saved
            refused = ", ".join(sorted({d.code for d in trial.errors})) if trial.resolved is None else ""
            reason = (f"the plan with it is refused ({refused})" if refused else
                      "the plan with it does not fit" if not fits else
                      f"measured ×{factor:.2f}, predicted {predicted / now:.2f}× with the budget it allows: not "
                      f"faster by more than the profile's tolerance, {tolerance:.0%}"
                      + (" (the scatter between its repeated measurements)" if tolerance > TOLERANCE else ""))
            search.considered += [Considered(k, v, f"{what}: {reason}") for k, v in knobs.items()]


def _rechoose_batches(search: _Search, dynamic: bool, objective: Objective) -> None:
    """After a fallback made room (offload, Ulysses), the batch knobs again as large as the room allows: the
    ladder's first step cut the budget to one sequence before a later one freed what it needed."""
    saved = (dict(search.tuned), dict(search.why))
    if dynamic:
        _budgets(search, objective)
    else:
        _micro_batches(search, objective)
    if not search.fits(search.current()):
        search.tuned, search.why = saved


def _throughput_model(costs: CostTable | str | os.PathLike | None, plan: CompileResult
                      ) -> tuple[str, str, Profile | None]:
    """The throughput model's state, in words, and the profile the tuner uses (None: the guide's order alone)."""
    try:
        table = costs if isinstance(costs, CostTable) else load_costs(costs)
    except CostFileError as exc:
        return "unreadable", f"throughput model unreadable ({exc}): the guide's order decides alone", None
    config = plan.config
    info = model_info(config.actor_rollout_ref.model.path, config.estimate.num_params_b)
    params_b = info.num_params / 1e9 if info is not None and info.num_params else None
    profile = table.profile_for(params_b, PROFILE_REACH)
    if profile is None:
        return ("unmeasured", f"throughput model: unmeasured ({table.path.name} holds no measured profile; "
                f"{MEASURE_HINT}): between plans that fit, the guide's order decides alone", None)
    size = f"{params_b:.2f}B" if params_b else "a model of unknown size"
    if params_b and profile.times_off(params_b) > PROFILE_REACH:
        return ("unmeasured", f"throughput model: unmeasured at {size} (the nearest profile, {profile.model} on "
                f"{profile.device}, is more than {PROFILE_REACH:g}× off in size; {MEASURE_HINT}): "
                "between plans that fit, the guide's order decides alone", None)
    note = f"throughput model: measured on {profile.describe()}"
    if params_b and profile.times_off(params_b) > 1.5:
        note += f"; applied to {size} as relative costs (not measured at this size)"
    return "measured", note, profile


_RATIO_WHY = {
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "forward only: 2× the actor's training budget (guide)",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "forward only: 2× the actor's training budget (guide)",
    "critic.ppo_max_token_len_per_gpu": "critic: 2× the actor's budget (guide: a value head needs far less than a vocabulary)",
    "critic.forward_max_token_len_per_gpu": "forward only: 2× the critic's training budget (guide)",
    "reward_model.forward_max_token_len_per_gpu": "reward model: as the critic's forward budget (guide: ≥ 2× the actor's)",
}


def _budget_knobs(search: _Search, actor_budget: int) -> dict[str, Any]:
    norm = search.original.normalized
    knobs: dict[str, Any] = {"actor_rollout_ref.actor.ppo_max_token_len_per_gpu": actor_budget}
    if norm.rollout.log_prob is not None:
        knobs["actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu"] = 2 * actor_budget
    if norm.ref is not None:
        knobs["actor_rollout_ref.ref.log_prob_max_token_len_per_gpu"] = 2 * actor_budget
    if norm.critic is not None:
        knobs["critic.ppo_max_token_len_per_gpu"] = 2 * actor_budget
        knobs["critic.forward_max_token_len_per_gpu"] = 4 * actor_budget
    if norm.reward_model is not None:
        knobs["reward_model.forward_max_token_len_per_gpu"] = 4 * actor_budget
    return knobs


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _micro_batches(search: _Search, objective: Objective) -> None:
    """Fixed micro batches: the actor's (and critic's) largest divisor of the normalized mini batch that fits
    ("raise *_micro_batch_size_per_gpu until it equals the normalized mini batch"), forward ones 2× (capped at
    the shard), the critic's and reward model's at least the actor's."""
    resolved = search.original.resolved
    mini = resolved.roles.actor.ppo_mini_batch_size_per_gpu
    options = divisors(mini)
    if objective == "memory":
        options = options[:1]
    chosen = options[0]
    for micro in reversed(options):
        if search.batches_fit(search.compile(_micro_knobs(search, micro))):
            chosen = micro
            break
    why = (f"the whole normalized mini batch ({mini} per GPU)" if chosen == mini else
           f"the largest divisor of the normalized mini batch ({mini} per GPU) whose estimate fits "
           f"{search.limit:.1f} GiB")
    for key, value in _micro_knobs(search, chosen).items():
        search.set(key, value, why if key == "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu" else
                   "forward only: 2× the training micro batch, at most the shard (guide)"
                   if "log_prob" in key or "forward" in key or key.startswith("reward_model") else
                   "critic: at least the actor's (guide: its head is small)")


def _micro_knobs(search: _Search, actor_micro: int) -> dict[str, Any]:
    norm, resolved = search.original.normalized, search.original.resolved
    config = search.original.config

    def forward(key: str, shard: int) -> int:
        """2× the training micro batch (guide), or what the plan has if larger, at most the shard."""
        return min(max(2 * actor_micro, _setting(config, key) or 0), shard)

    log_prob_shard = resolved.roles.rollout.log_prob.sequences_per_gpu if resolved.roles.rollout.log_prob else actor_micro
    knobs: dict[str, Any] = {"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": actor_micro}
    if norm.rollout.log_prob is not None:
        key = "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"
        knobs[key] = forward(key, log_prob_shard)
    if norm.ref is not None:
        key = "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"
        knobs[key] = forward(key, resolved.roles.ref.sequences_per_gpu)
    if norm.critic is not None:
        critic_mini = resolved.roles.critic.ppo_mini_batch_size_per_gpu
        critic = max(d for d in divisors(critic_mini) if d <= max(actor_micro, 1)) if critic_mini else actor_micro
        knobs["critic.ppo_micro_batch_size_per_gpu"] = critic
        knobs["critic.forward_micro_batch_size_per_gpu"] = min(2 * critic, resolved.roles.critic_values.sequences_per_gpu)
    if norm.reward_model is not None:
        key = "reward_model.micro_batch_size_per_gpu"
        knobs[key] = forward(key, resolved.roles.reward_model.sequences_per_gpu)
    return knobs


def _fully_async_calls(search: _Search) -> None:
    """Fully async on vLLM: a replica's share of a step in its engine at once (RL371: a smaller window puts fewer
    sequences in an engine step). The window does not change the training: the staleness bound counts groups, not
    windows (rlconf.normalize.fully_async_sizes)."""
    original = search.original
    sched = original.resolved.schedule
    if original.config.actor_rollout_ref.rollout.name != "vllm" or sched.replica_window >= sched.replica_share:
        return  # 0 and 0: not fully async
    share = sched.replica_share
    search.set("async_training.concurrent_samples_per_replica", share,
               f"a replica's share of a step ({share} groups) in its engine at once: fewer put fewer sequences in "
               f"an engine step (RL371); the staleness bound counts groups, so it stays {sched.max_staleness} step(s)")


def _rollout(search: _Search) -> None:
    """vLLM's share of the GPU: as much as the rollout phase's other residents leave, within the guide's range."""
    config = search.original.config
    rollout = config.actor_rollout_ref.rollout
    if rollout.name != "vllm" or config.trainer.device != "cuda":
        return
    # The search's offload (a fallback may have turned it on since the plan's), not the plan's alone.
    offloaded = any(search.value(f"actor_rollout_ref.actor.fsdp_config.{knob}")
                    for knob in ("param_offload", "optimizer_offload", "offload_policy"))
    # The guide's range guards the actor's states beside vLLM; a rollout pool of its own (off-policy) holds none.
    apart = search.original.resolved.schedule.mode != "colocated_sync"
    top = UTILIZATION_MAX_OFFLOADED if offloaded or apart else UTILIZATION_MAX
    gib = search.original.config.estimate.gpu_memory_gib
    now = search.current()
    rollout_phases = [p for p in now.resolved.memory if p.phase == "rollout"]
    resident = max((sum(t.gib for t in p.terms if not t.what.startswith("vLLM")) for p in rollout_phases), default=0.0)
    room = (search.limit - resident) / gib
    best = math.floor(min(room, top) / UTILIZATION_STEP + 1e-9) * UTILIZATION_STEP
    # The share must hold vLLM's weights (one tensor-parallel shard) and a KV cache (RL611): the floor for large
    # models on small shares, before any measured preference for a low one.
    # Above the range's top no share holds them: the plan does not fit (fits() sees RL611) and the fallbacks or
    # the refusal speak.
    floor = _vllm_floor(now, gib)
    least = max(UTILIZATION_MIN, floor if floor <= top else 0.0)
    best = round(max(best, least), 2)
    why = (f"the rollout phase's other residents take {resident:.1f} GiB of the {search.limit:.1f} GiB "
           f"allowed; at most {top} " + ("(the rollout's pool of its own)" if apart else
                                          "(offloaded)" if offloaded else "(RL602: the guide’s 0.5-0.7)"))
    profile = search.profile
    # A measured generation curve decides below; without one, the share stops where the round's KV cache fits.
    enough = None if profile is not None and profile.generate_s_per_ktoken else _vllm_round_share(search, now, gib)
    if enough is not None and enough[0] < best:
        best = round(max(least, enough[0]), 2)
        why = enough[1] + (f"; the least share taken is {least}" if enough[0] < least else "")
    if profile is not None and profile.generate_s_per_ktoken and best > least:
        steps = round((best - least) / UTILIZATION_STEP)
        options = [round(least + i * UTILIZATION_STEP, 2) for i in range(steps + 1)]
        times = {u: profile.generate_time(u) for u in options}
        fastest = min(times.values())
        # TOLERANCE, as for the budget: a lower share is worth taking only where the curve is flat, since the
        # memory it leaves free is lent to nothing while vLLM generates.
        lowest = min(u for u, t in times.items() if t <= fastest * (1 + TOLERANCE))
        if lowest < best:
            why = (f"measured generate time per token within {TOLERANCE:.0%} of the best at {lowest} (up to {best} "
                   f"would fit): the rest of the GPU stays free ({_model_ref(profile, generation=True)})")
            best = lowest
    if best != rollout.gpu_memory_utilization:
        search.set("actor_rollout_ref.rollout.gpu_memory_utilization", best, why)
    _async_scheduling(search)
    _vllm_processes(search)
    if rollout.max_num_batched_tokens <= 2048:
        model_len = search.original.normalized.rollout.max_model_len.value
        search.set("actor_rollout_ref.rollout.max_num_batched_tokens", max(MIN_BATCHED_TOKENS, model_len),
                   "the guide: above 2048 for throughput (RL601)")
    _max_num_seqs(search)


FREE_CACHE_ENGINE = "actor_rollout_ref.rollout.free_cache_engine"


def _keep_awake(search: _Search, objective: Objective) -> None:
    """vLLM kept awake between rollouts (free_cache_engine false) where nothing needs its memory back.

    - A rollout pool of its own (off-policy schedules, any backend): nothing else runs on those GPUs, so a sleep
      frees memory for nobody (RL363; verl's off-policy trainers keep it false). Taken.
    - Beside the actor (the hybrid engine, vLLM on CUDA, the throughput objective, a plan that fits): where vLLM's
      share fits beside the training phase with every other knob as chosen (the estimate then counts it there,
      "vLLM reservation kept") and raises no new diagnostic, each step skips the engine's sleep, its two wakes and
      the push into a waking engine. Taken where the profile measured it faster by more than its generation
      tolerance (`keep_awake_factor`: the rollout's part of a step awake ÷ asleep, bench/tune_generate_costs.py's
      `-awake` points); otherwise weighed, with the launches that measured it so far (AWAKE_MEASURED), which
      disagree.
    The memory objective keeps the sleep without a word: it frees vLLM's share for the training phase."""
    config = search.original.config
    if not search.value(FREE_CACHE_ENGINE):
        return
    if search.original.resolved.schedule.mode != "colocated_sync":
        # Any backend, any device: RL363 warns on all, and the rollout pool's worker keeps its engine awake anyway.
        search.set(FREE_CACHE_ENGINE, False, "a rollout pool of its own: nothing else uses its GPUs between rollouts, "
                                             "a sleep frees memory for nobody (RL363)")
        return
    if config.actor_rollout_ref.rollout.name != "vllm" or config.trainer.device != "cuda":
        return
    if search.value(MP_KEY) == "mp" and MP_KEY in search.tuned:
        # Each was measured against the in-process engine asleep, never the two together (the bench refuses an
        # -awake-mp point), and the estimate has no term for the push buffer beside an awake KV cache.
        search.considered.append(Considered(FREE_CACHE_ENGINE, False, "vLLM kept awake: not with vLLM in processes of "
                                                                      "its own, which the tuner took; the two were "
                                                                      "never measured together"))
        return
    now = search.current()
    if objective != "throughput" or not search.fits(now):
        return
    awake = search.compile({FREE_CACHE_ENGINE: False})
    # By message, not code alone: a second instance of a warning the plan already has is new too.
    had = {(d.code, d.message) for d in now.diagnostics}
    new = sorted({d.code for d in awake.diagnostics if (d.code, d.message) not in had})
    profile = search.profile
    factor = profile.factor("keep_awake_factor") if profile is not None else None
    if awake.resolved is None:
        reason = f"it raises {', '.join(new) or 'an error'}"
    elif not search.fits(awake):
        worst = max(awake.resolved.memory, key=lambda phase: phase.total_gib)
        reason = (f"with vLLM's share kept, the {worst.phase} phase on pool `{worst.pool}` would need "
                  f"{worst.total_gib:.1f} GiB a GPU, over the {search.limit:.1f} GiB allowed")
    elif new:
        reason = f"it raises {', '.join(new)}"
    else:
        training = max((p.total_gib for p in awake.resolved.memory if p.phase == "training"), default=0.0)
        fits = f"it fits ({training:.1f} GiB a GPU in the training phase, of {search.limit:.1f} allowed)"
        if factor is None:
            reason = f"{fits} but is not taken: {AWAKE_MEASURED}; set {FREE_CACHE_ENGINE}=false to try it"
        elif factor < 1 - profile.tolerance("generate"):
            search.set(FREE_CACHE_ENGINE, False,
                       f"vLLM kept awake through training: {fits}; measured ×{factor:.2f} the rollout's time a step "
                       f"(no sleep, no wakes) ({_model_ref(profile, generation=True)})")
            return
        else:
            reason = (f"{fits}; measured ×{factor:.2f} the rollout's time a step: not faster by more than the "
                      f"profile's tolerance, {profile.tolerance('generate'):.0%}")
    search.considered.append(Considered(FREE_CACHE_ENGINE, False, f"vLLM kept awake through training: {reason}"))


# What keeping vLLM awake beside the actor measured in launches (docs/benchmarks.md, 2026-11-28 late, one launch
# each): what the output says where no profile has measured keep_awake_factor.
AWAKE_MEASURED = ("measured 1.11x the step at 7B on two H200s (the same knobs asleep, in one call), but the tuned "
                  "plan awake ran 0.82x the hand plan at 1.5B on one H200, its generation slower, cause not "
                  "established")


def _vllm_round_share(search: _Search, result: CompileResult, gib: float) -> tuple[float, str] | None:
    """The least share whose KV cache holds twice over as many sequences as the replica is handed at once (its
    round, rounded up to vLLM's CUDA graph sizes as max_num_seqs is), each at its
    longest (max_model_len), and why; None where that is not known (fully async streams calls, the model's shape
    unknown). The guide raises the share for a larger batch; once the whole round fits, more KV cache lets no more
    sequences run. Measured: the 0.5B profile's generation took the same time per token at 0.3 and at 0.7; 7B on
    two H200s (2026-11-28, docs/benchmarks.md) generated in the worker as fast at 0.55 as at 0.3 (2.73 against
    2.69 s), while its whole generate stage, with the sleep and wake of the larger cache, took 3.23 against 2.93 s
    (one pair of launches). Twice: vLLM's blocks and its activations' estimate are not exact, and a preempted
    sequence costs more than the cache it would have used."""
    from rlconf.estimate import DTYPE_BYTES, kv_cache_bytes_per_token, vllm_least_utilization

    if result.resolved.schedule.mode == "fully_async":
        return None
    config, norm = search.original.config, search.original.normalized
    info = model_info(config.actor_rollout_ref.model.path, config.estimate.num_params_b)
    per_token = kv_cache_bytes_per_token(info, DTYPE_BYTES[config.actor_rollout_ref.rollout.dtype]) if info else None
    weights = _vllm_weights(result)
    if per_token is None or not weights:
        return None
    # tensor parallel splits the KV heads (a head is never split: beyond their count, the heads are replicated)
    split = min(norm.rollout.tensor_parallel_size, info.num_key_value_heads or info.num_attention_heads or 1)
    in_flight, model_len = norm.rollout.sequences_per_replica.value, norm.rollout.max_model_len.value
    # the round on vLLM's CUDA graph grid, as _max_num_seqs caps it: room for the whole round at once, as the guide
    # asks of max_num_seqs (a larger decode batch), and for a validation round, which max_num_seqs bounds
    at_once = in_flight_cap(in_flight)
    kv_gib = at_once * model_len * per_token / split / 2**30
    share = vllm_least_utilization(weights, gib, 2 * kv_gib)
    return share, (f"vLLM's weights ({weights:.1f} GiB), twice the KV cache of {at_once} sequences at once (a "
                   f"replica's round: {in_flight} sequences) at {model_len} tokens ({kv_gib:.2f} GiB) and 5% of the "
                   f"GPU fit at {share:g}: a larger share runs no more sequences at once (docs/tune.md)")


def _vllm_weights(result: CompileResult) -> float:
    """vLLM's weights on one GPU, as the estimate counts them (its "vLLM <dtype> weights" term; 0: none)."""
    return max((t.gib for p in result.resolved.memory for t in p.terms
                if t.what.startswith("vLLM ") and t.what.endswith(" weights")), default=0.0)


def _vllm_floor(result: CompileResult, gib: float) -> float:
    """The least gpu_memory_utilization whose share holds vLLM's weights, as the estimate counts them (its
    "vLLM <dtype> weights" term), and a KV cache (0: no such term, an unknown size)."""
    from rlconf.estimate import vllm_least_utilization

    weights = _vllm_weights(result)
    return vllm_least_utilization(weights, gib) if weights else 0.0


def _async_scheduling(search: _Search) -> None:
    """vLLM's async scheduling (the next engine step scheduled while the GPU runs this one): on where the profile
    measured it faster than an engine that turned it off by name, off where slower. Left unset, vLLM 0.25 turns it
    on itself wherever the executor supports it (the engine's external_launcher one does), so "unset" is not
    "off" there and a measured loss must be said by name. Not in the guide, so never without a measurement; not
    for the fully async schedule, whose partial rollouts (a call cut between engine steps) ran only with vLLM
    0.25's default; a plan that sets it keeps it."""
    profile = search.profile
    factor = profile.factor("async_scheduling_factor") if profile is not None else None
    engine = search.original.config.actor_rollout_ref.rollout.engine_kwargs.vllm
    key = "actor_rollout_ref.rollout.engine_kwargs.vllm.async_scheduling"
    if factor is None or "async_scheduling" in engine or search.original.resolved.schedule.mode == "fully_async":
        return
    tolerance = profile.tolerance("generate")
    if factor > 1 + tolerance:
        search.set(key, False, f"vLLM's async scheduling off: measured ×{factor:.2f} generate time with it "
                               f"(vLLM 0.25 turns it on when unset) ({_model_ref(profile, generation=True)})")
        return
    if factor >= 1 - tolerance:
        search.considered.append(Considered(key, True, f"vLLM's async scheduling: measured ×{factor:.2f} generate "
                                                       f"time, not faster or slower by more than the profile's "
                                                       f"tolerance, {tolerance:.0%}"))
        return
    search.set(key, True,
               f"vLLM's async scheduling: measured ×{factor:.2f} generate time ({_model_ref(profile, generation=True)})")


MP_KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend"


def _vllm_processes(search: _Search) -> None:
    """vLLM's engine core and model runner in processes of their own (distributed_executor_backend mp, verl's
    layout), where the profile measured the rollout's part of a step faster that way than in process by more than
    its generation tolerance. Not in the guide, so never without a measurement, and only where it was measured: the
    colocated step with vLLM asleep between rollouts (bench/tune_generate_costs.py's `-mp` points; not a rollout
    pool of its own, whose engine never sleeps, nor the fully async schedule, nor kept awake: _keep_awake leaves a
    plan taken here asleep), and where `mp` runs (vLLM, one GPU a replica, rlconf's own worker extension: RL372). A
    plan that names a backend keeps it."""
    profile = search.profile
    factor = profile.factor("own_processes_factor") if profile is not None else None
    config = search.original.config
    rollout = config.actor_rollout_ref.rollout
    if (factor is None or rollout.name != "vllm" or "distributed_executor_backend" in rollout.engine_kwargs.vllm
            or search.original.resolved.schedule.mode != "colocated_sync" or not rollout.free_cache_engine):
        return
    tolerance = profile.tolerance("generate")
    measured = f"measured ×{factor:.2f} the rollout's time a step ({_model_ref(profile, generation=True)})"
    if factor >= 1 - tolerance:
        verdict = "slower" if factor > 1 + tolerance else f"not faster by more than the profile's tolerance, {tolerance:.0%}"
        search.considered.append(Considered(MP_KEY, "mp", f"vLLM in processes of its own: {measured}, {verdict}"))
        return
    refused = ("a tensor-parallel replica runs in process only" if rollout.tensor_model_parallel_size > 1 else
               "the plan's own worker_extension_cls" if "worker_extension_cls" in rollout.engine_kwargs.vllm else None)
    if refused:
        search.considered.append(Considered(MP_KEY, "mp", f"vLLM in processes of its own: {measured}, faster, but "
                                                          f"{refused} (RL372)"))
        return
    search.set(MP_KEY, "mp", f"vLLM's engine core and model runner in processes of their own (verl's layout): "
                             f"{measured}")


def in_flight_cap(sequences_per_replica: int) -> int:
    """The smallest max_num_seqs that holds `sequences_per_replica` at once, on vLLM's CUDA graph grid."""
    if sequences_per_replica <= GRAPH_BATCH_STEP:
        return 1 << max(0, sequences_per_replica - 1).bit_length()  # 1, 2, 4, 8
    return math.ceil(sequences_per_replica / GRAPH_BATCH_STEP) * GRAPH_BATCH_STEP


def _max_num_seqs(search: _Search) -> None:
    """max_num_seqs down to what a replica ever has in flight, never below it (vLLM would queue the rest).

    One generate call a replica at a time (colocated, one-step off-policy) hands it its share of the round's
    sequences at once and no more; fully async streams calls into a pool, so its count is left alone. Measured on
    an H100 (vLLM 0.25, docs/benchmarks.md 2026-11-27): 64 instead of 256 for a 64-sequence replica decoded 4-7%
    faster in two rounds, and captured its CUDA graphs 1.1 s sooner (fewer sizes to capture)."""
    resolved = search.original.resolved
    if resolved.schedule.mode == "fully_async":
        return
    rollout = search.original.config.actor_rollout_ref.rollout
    in_flight = search.original.normalized.rollout.sequences_per_replica.value
    cap = in_flight_cap(in_flight)
    if cap < rollout.max_num_seqs:
        search.set("actor_rollout_ref.rollout.max_num_seqs", cap,
                   f"a replica has at most {in_flight} sequences in flight (its share of a generation round), "
                   f"{cap} on vLLM's CUDA graph sizes: fewer graphs to capture; measured 4-7% faster decode "
                   f"at 64 than 256 on an H100")


def _triton_head(search: _Search) -> bool:
    """The plan's loss head runs rlconf's Triton kernels (rlconf.loss_head), which keep no fp32 [tokens, vocab]
    tensor: chunked entropy would change nothing there (RL529)."""
    return plan_loss_head_kernels(search.original.config) == "triton"


def _fallbacks(search: _Search) -> None:
    """In the guide's order, only while the plan does not fit: each step kept if the plan still does not fit
    without the next one."""
    norm, config = search.original.normalized, search.original.config
    seq = norm.rollout.prompt_length.value + norm.rollout.response_length.value
    steps: list[tuple[dict[str, Any], str]] = [
        (_budget_knobs(search, seq), f"one sequence per micro batch ({seq} tokens): the smallest budget that runs"),
        *([] if _triton_head(search) else [({"actor_rollout_ref.actor.entropy_from_logits_with_chunking": True},
                                            "chunked entropy: the loss head's fp32 logits a chunk at a time")]),
        ({"actor_rollout_ref.actor.fsdp_config.param_offload": True,
          "actor_rollout_ref.actor.fsdp_config.optimizer_offload": True},
         "offload: the actor's parameters and Adam moments wait on the CPU while they are not used"),
    ]
    if norm.critic is not None:
        steps.append(({"critic.model.fsdp_config.param_offload": True, "critic.model.fsdp_config.optimizer_offload": True},
                      "offload: the critic's states wait on the CPU while they are not used"))
    info = model_info(config.actor_rollout_ref.model.path, config.estimate.num_params_b)
    heads = info.num_attention_heads if info is not None else None
    for sp in (2, 4, 8):
        if heads and heads % sp == 0 and norm.actor.pool_gpus % sp == 0:
            # compile_layers cannot run with Ulysses (RL527): a trade that turned it on gives way.
            uncompiled = {"actor_rollout_ref.model.compile_layers": False} if search.value(
                "actor_rollout_ref.model.compile_layers") else {}
            steps.append(({"actor_rollout_ref.actor.ulysses_sequence_parallel_size": sp, **uncompiled,
                           **_budget_knobs(search, math.ceil(2 * seq / sp))},
                          f"Ulysses over {sp} GPUs: each holds 1/{sp} of a micro batch's tokens"))
    for knobs, why in steps:
        for key, value in knobs.items():
            search.set(key, value, why)
        if vllm_share_short(search.current()) is not None:
            _rollout(search)  # offloaded now, vLLM's share may go to 0.9: the room its weights need (RL611)
        if search.fits(search.current()):
            return


def vllm_share_short(result: CompileResult) -> Diagnostic | None:
    """RL611, where vLLM's weights fill its share of the GPU (no KV cache: the engine would not start)."""
    return next((d for d in result.diagnostics if d.code == "RL611"), None)


def _why_not(result: CompileResult, limit: float, gib: float) -> str:
    if result.resolved is None:
        return "the tuned plan does not compile: " + "; ".join(d.message for d in result.errors)
    share = vllm_share_short(result)
    worst = max(result.resolved.memory, key=lambda phase: phase.total_gib)
    if share is not None and worst.total_gib <= limit:  # every phase fits: vLLM's share is what does not
        return f"even with every knob of the guide, {share.message} ({share.help})"
    top = max(worst.terms, key=lambda term: term.gib)
    return (f"even with every knob of the guide, the {worst.phase} phase on pool `{worst.pool}` is estimated at "
            f"{worst.total_gib:.1f} GiB per GPU, over the {limit:.1f} GiB allowed ({gib:g} GiB ÷ {SAFETY} safety); "
            f"its largest term is {top.what} ({top.gib:.1f} GiB: {top.formula}). It fits with more GPUs (the states "
            "shard over them), a shorter prompt + response, or a smaller model")


def tuned_plan_yaml(plan_path: str | os.PathLike, out_path: str | os.PathLike, result: TuneResult,
                    overrides: list[str] | tuple[str, ...] = ()) -> str:
    """A plan file that is `plan_path` (as its `base:`) plus the user's overrides and the tuned knobs."""
    from pathlib import Path

    base = os.path.relpath(Path(plan_path).resolve(), Path(out_path).resolve().parent)
    tree: dict[str, Any] = {}
    from rlconf.loader import parse_override

    for text in [*overrides, *result.overrides]:
        parts, value = parse_override(text)
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value
    lines = ["# Written by `rlconf tune`: the plan below as its base, with the per-GPU knobs the tuner chose.",
             f"base: {base}"]
    lines += _yaml_lines(tree, 0)
    return "\n".join(lines) + "\n"


def _yaml_lines(tree: dict[str, Any], indent: int) -> list[str]:
    out = []
    for key, value in tree.items():
        if isinstance(value, dict):
            out.append(" " * indent + f"{key}:")
            out += _yaml_lines(value, indent + 2)
        else:
            out.append(" " * indent + f"{key}: {_yaml(value)}")
    return out

