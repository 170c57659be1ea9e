"""The pipeline: load -> schema -> normalize -> rules -> resolved plan. Never raises on bad input:
every problem becomes a located Diagnostic and an exit code (0 ok, 1 invalid plan, 2 unreadable)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache

from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ValidationError

from rlconf.diagnostics import Diagnostic, PlanInputError, Severity, warning
from rlconf.loader import RawPlan, load_plan
from rlconf.sources import SourceMap
from rlconf.modelinfo import is_hub_id, model_info
from rlconf.normalize import Normalized, normalize
from rlconf.rules import run_rules
from rlconf.schema import PlanConfig
from rlconf.schema.verl_only import split_verl_keys

if TYPE_CHECKING:
    from rlconf.resolved import ResolvedPlan

EXIT_OK, EXIT_INVALID, EXIT_UNREADABLE = 0, 1, 2


@dataclass
class CompileResult:
    diagnostics: list[Diagnostic]
    sources: SourceMap = field(default_factory=SourceMap)
    raw: RawPlan | None = None
    config: PlanConfig | None = None
    normalized: Normalized | None = None
    resolved: ResolvedPlan | None = None  # only when compiled with resolve=True and no errors
    input_exit_code: int | None = None  # set when the plan could not be read

    @property
    def errors(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.is_error]

    @property
    def warnings(self) -> list[Diagnostic]:
        return [d for d in self.diagnostics if d.severity is Severity.WARNING]

    def exit_code(self, strict: bool = False) -> int:
        if self.input_exit_code is not None:
            return self.input_exit_code
        if self.errors or (strict and self.warnings):
            return EXIT_INVALID
        return EXIT_OK


def _locate(diags: list[Diagnostic], sources: SourceMap) -> list[Diagnostic]:
    out = []
    for d in diags:
        if d.location is not None:
            out.append(d)
            continue
        by_key = d.code in {"RL101", "RL106", "RL107"}
        loc = sources.locate_key(d.key) if by_key else sources.locate(d.key)
        out.append(d.at(loc))
    return out


def validate_schema(data: dict[str, Any]) -> PlanConfig:
    """PlanConfig.model_validate(data), done so that pydantic builds one validator and skips its
    plugin scan: building validators is most of what a cold `rlconf validate` spends of its own."""
    with _no_pydantic_plugins():
        return PlanConfig.model_validate(with_default_sections(PlanConfig, data))


@contextmanager
def _no_pydantic_plugins() -> Iterator[None]:
    """Pydantic looks for plugins (an entry-point scan of every installed distribution, ~8 ms) the
    first time it builds a validator; the plan's validator has no use for them. typer turns them
    off the same way around the validators it builds for CLI parameters."""
    previous = os.environ.get("PYDANTIC_DISABLE_PLUGINS")
    os.environ["PYDANTIC_DISABLE_PLUGINS"] = "1"
    try:
        yield
    finally:
        if previous is None:
            del os.environ["PYDANTIC_DISABLE_PLUGINS"]
        else:
            os.environ["PYDANTIC_DISABLE_PLUGINS"] = previous


def with_default_sections(model: type[BaseModel], data: Any) -> Any:
    """`data` with every absent section whose default is an empty section written out as `{}`.

    The plan is the same either way, but pydantic validates a written `{}` with the plan's one
    validator, while a `default_factory=Section` default builds a validator of its own for each
    section class on first use (15 more schema builds, ~15 ms of a cold `rlconf validate`)."""
    if not isinstance(data, dict):
        return data
    out = dict(data)
    for name, section, defaults_to_empty in _section_fields(model):
        if name not in out:
            if not defaults_to_empty:
                continue
            out[name] = {}
        out[name] = with_default_sections(section, out[name])
    return out


@cache
def _section_fields(model: type[BaseModel]) -> tuple[tuple[str, type[BaseModel], bool], ...]:
    """(name, section class, whether its default is an empty section) for each section field."""
    found = []
    for name, info in model.model_fields.items():
        section = info.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            found.append((name, section, info.default_factory is section))
    return tuple(found)


def _vllm_share_checks(config: Any, norm: Any, model: Any) -> list[Diagnostic]:
    """RL611: vLLM's weights (one tensor-parallel shard) fill its gpu_memory_utilization share of the GPU, leaving
    no KV cache: vLLM loads them, finds no room for one block and will not start."""
    from rlconf.estimate import VLLM_UTILIZATION_CEILING, params_text, vllm_least_utilization, vllm_weights_gib

    rollout = config.actor_rollout_ref.rollout
    if rollout.name != "vllm" or config.trainer.device != "cuda" or model is None or not model.num_params:
        return []
    gpu = config.estimate.gpu_memory_gib
    tp = norm.rollout.tensor_parallel_size
    weights = vllm_weights_gib(rollout.dtype, model.num_params, tp)
    share = rollout.gpu_memory_utilization * gpu
    if weights < share:
        return []
    least = vllm_least_utilization(weights, gpu)
    if least <= VLLM_UTILIZATION_CEILING:
        fix = f"raise gpu_memory_utilization to at least {least:g} (the weights and some KV cache)"
    else:  # the smallest power-of-two tensor parallel size whose shard leaves vLLM a KV cache within the ceiling
        wider = next(t for t in (tp * 2 ** k for k in range(1, 12))
                     if vllm_least_utilization(weights * tp / t, gpu) <= VLLM_UTILIZATION_CEILING)
        fix = (f"shard the weights over more GPUs: tensor_model_parallel_size {wider} holds "
               f"{weights * tp / wider:.1f} GiB per GPU (gpu_memory_utilization ≥ "
               f"{vllm_least_utilization(weights * tp / wider, gpu):g}), or use larger GPUs")
    return [warning("RL611", "actor_rollout_ref.rollout.gpu_memory_utilization",
                    f"vLLM's weights take {weights:.1f} GiB per GPU ({params_text(model.num_params)} params ÷ tp {tp}), "
                    f"all of its share gpu_memory_utilization {rollout.gpu_memory_utilization:g} × {gpu:g} GiB = "
                    f"{share:.1f} GiB: no room is left for a KV cache and vLLM will not start",
                    help=fix + "; estimate.gpu_memory_gib says the GPU's memory")]


def compile_plan(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = (), resolve: bool = True) -> CompileResult:
    """`resolve=False` skips the memory estimate and the resolved plan (what `validate` needs)."""
    try:
        raw = load_plan(path, overrides)
    except PlanInputError as exc:
        sources = exc.sources or SourceMap()
        return CompileResult([exc.diagnostic], sources, input_exit_code=exc.exit_code)
    split = split_verl_keys(raw.data, raw.sources)  # verl keys the schema does not hold: RL108 / RL109
    try:
        config = validate_schema(split.data)
    except ValidationError as exc:
        from rlconf.schema.errors import schema_diagnostics

        return CompileResult(_locate(split.diagnostics + schema_diagnostics(exc, split.data), raw.sources),
                             raw.sources, raw)
    norm = normalize(config)
    model = model_info(config.actor_rollout_ref.model.path, config.estimate.num_params_b)
    rm = config.reward_model
    # The FSDP reward-model worker's model (a served one is sized by its engine's share): its rules and its memory.
    rm_model = model_info(rm.model.path) if norm.reward_model is not None and rm.model.path else None
    diagnostics = split.diagnostics + run_rules(config, norm, model, split.data, rm_model)
    memory = []
    if resolve and not any(d.is_error for d in diagnostics):
        from rlconf.estimate import estimate_memory

        memory = estimate_memory(config, norm, model, rm_model)
        if memory and not model.has_shapes:
            path = config.actor_rollout_ref.model.path
            fetch = f"`hf download {path} config.json` puts its config in the HF cache, where rlconf looks; or "
            diagnostics.append(warning(
                "RL610", "actor_rollout_ref.model.path",
                f"the memory estimate leaves out activations and logits: rlconf knows the size of `{path}` "
                "but not its shape",
                help=(fetch if is_hub_id(path) else "") + "point model.path at a local model directory with its config.json"))
        diagnostics += _vllm_share_checks(config, norm, model)
        for phase in memory:
            if phase.total_gib > config.estimate.gpu_memory_gib:
                diagnostics.append(warning(
                    "RL609", "estimate.gpu_memory_gib",
                    f"estimated {phase.phase} memory on pool `{phase.pool}` is {phase.total_gib:.1f} GiB per GPU, over the {config.estimate.gpu_memory_gib:g} GiB of a GPU",
                    help="offload parameters/optimizer, enable gradient checkpointing, shrink micro batches or token budgets, or add GPUs"))
    diagnostics = _locate(diagnostics, raw.sources)
    result = CompileResult(diagnostics, raw.sources, raw, config, norm)
    if resolve and not result.errors:
        from rlconf.resolved import build_resolved

        result.resolved = build_resolved(config, norm, model, memory, diagnostics, raw.files, list(overrides))
    return result
