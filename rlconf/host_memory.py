"""What offloaded training states take of the machines' memory: `rlconf explain` prints it, and a local launch
(engine.launch) checks it against this machine's memory before Ray starts.

param_offload keeps each rank's fp32 shard in a page-locked host block (4 B a parameter ÷ shards) for the whole
run, optimizer_offload Adam's two fp32 moments (8 B), and the reference's param_offload its compute-dtype shard
(engine/workers/fsdp/host_copies.py); offload_policy (FSDP2's CPUOffloadPolicy) keeps parameters, gradients and
moments on the host (16 B). Summed over the ranks of one machine, that is the whole model's bytes once per FSDP
replica. At the end of the run the optimizers are released and rank 0 gathers the actor's full fp32 weights for
the HF export (4 B a parameter) beside what stays.

A 7B actor with param and optimizer offload on one H200 held 91–93 GiB of its 125 GiB host while it trained
(docs/benchmarks.md, 2026-11-28 evening); Ray's memory monitor stops a worker above 95% of the host's memory,
and the workers' own memory (CUDA, vLLM, Python) comes on top of these states. Pure arithmetic: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlconf.estimate import DTYPE_BYTES
from rlconf.lora_adapter import actor_lora
from rlconf.resolved import ResolvedPlan

GIB = 1024**3
RAY_MEMORY_THRESHOLD = 0.95  # Ray's default memory_usage_threshold: above it, its monitor stops workers
WARN_SHARE = 0.75  # of the host's memory: above it the launch says what the offloaded states will take


@dataclass(frozen=True)
class HostNeed:
    training: dict[str, float]  # bytes over the run's machines while it trains, by what holds them
    gathered: float  # the actor's full fp32 weights, which the end-of-run export gathers on rank 0's machine
    kept: float  # what stays offloaded at that export: the parameters (the optimizers are released)

    @property
    def export(self) -> float:
        """Bytes at the end-of-run export: the parameters that stay, plus the gathered actor."""
        return self.kept + self.gathered

    @property
    def training_total(self) -> float:
        return sum(self.training.values())


def _replicas(world_size: int, fsdp_size: int) -> int:
    """Full copies of the model's shards over a role's ranks: one, or world ÷ fsdp_size with HSDP."""
    shards = fsdp_size if 0 < fsdp_size < world_size else world_size
    return max(1, world_size // max(shards, 1))


def host_need(resolved: ResolvedPlan) -> HostNeed | None:
    """What the offload knobs hold over all of the run's machines (all of them on this one in a local launch);
    None without a parameter count."""
    params = resolved.model.num_params
    if not params:
        return None
    plan = resolved.config
    arr, roles = plan.actor_rollout_ref, resolved.roles
    lora = actor_lora(arr.model) is not None
    compute = DTYPE_BYTES[arr.model.dtype]
    held: dict[str, float] = {}
    kept = 0.0  # what stays once the optimizers are released: the parameters

    def add(what: str, nbytes: float, stays: float) -> None:
        nonlocal kept
        if nbytes:
            held[what] = held.get(what, 0.0) + nbytes
            kept += stays

    def trained(name: str, fsdp: Any, world_size: int) -> None:
        copies = _replicas(world_size, fsdp.fsdp_size) * params
        if getattr(fsdp, "offload_policy", False):
            add(f"{name} parameters, gradients and Adam moments (offload_policy)", 16 * copies, 4 * copies)
            return
        # A LoRA actor's frozen base is in the compute dtype; its adapters' states are small beside it.
        frozen = name == "actor" and lora
        if fsdp.param_offload:
            width = compute if frozen else 4
            add(f"{name} parameters (param_offload)", width * copies, width * copies)
        if getattr(fsdp, "optimizer_offload", False) and not frozen:
            add(f"{name} Adam moments (optimizer_offload)", 8 * copies, 0.0)

    trained("actor", arr.actor.fsdp_config, roles.actor.world_size)
    if roles.critic is not None:
        trained("critic", plan.critic.model.fsdp_config, roles.critic.world_size)
    if roles.ref is not None and not lora and arr.ref.fsdp_config.param_offload:
        ref_bytes = compute * _replicas(roles.ref.world_size, -1) * params
        add("reference parameters (param_offload)", ref_bytes, ref_bytes)
    return HostNeed(training=held, gathered=4 * params, kept=kept)


def host_memory_bytes(meminfo: Path = Path("/proc/meminfo")) -> int | None:
    """This machine's memory (MemTotal), None where /proc/meminfo is not there to say."""
    try:
        for line in meminfo.read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def host_memory_note(need: HostNeed | None, total: int | None) -> tuple[str, bool] | None:
    """(a line for the launch, whether to refuse it) where the offloaded states take more than WARN_SHARE of this
    machine's memory; refused where they alone are more than it has."""
    if need is None or total is None or not need.training:
        return None
    peak = max(need.training_total, need.export)
    if peak <= WARN_SHARE * total:
        return None
    parts = ", ".join(f"{what} {nbytes / GIB:.1f}" for what, nbytes in need.training.items())
    refuse = peak > total
    verdict = ("more than it has; offload less, or spread the run over more machines (each holds its own ranks' "
               "shards)" if refuse else
               f"Ray stops a worker above {RAY_MEMORY_THRESHOLD:.0%} of it, and the workers' own memory (CUDA, "
               "vLLM, Python) comes on top")
    return (f"the offloaded training states will hold {need.training_total / GIB:.1f} GiB of this machine's memory "
            f"({parts} GiB), and the end-of-run export {need.export / GIB:.1f} GiB (the actor's full fp32 weights "
            f"beside the parameters' copies); this machine has {total / GIB:.1f} GiB: {verdict}"), refuse
