"""rlconf tune's throughput model: per-knob cost terms measured on GPUs, read from rlconf/tune_costs.json.

The memory estimate says which plans fit; this says which of them is faster. Its terms are measured by
bench/tune_training_costs.py and bench/tune_generate_costs.py (every point alive in one process or beside it,
timed round by round, so the host's drift falls on all alike) or bench/tune_costs.py (launches of one workload
with one knob changed at a time), and written into the JSON file with their provenance (device, date, command,
commit): nothing here is a guess. A file with
no profile is the "unmeasured" state: the tuner says so and the guide's order decides alone.

A profile holds, for one device and model shape (relative terms, so a profile also informs other sizes,
which the tuner then says):
- `training_s_per_ktoken`: the training passes' seconds (old log-probs + update) per thousand tokens,
  by sequences per micro batch (the token budget ÷ one sequence): how the budget pays;
- `checkpointing_off_factor`, `entropy_chunking_factor`, `offload_factor`, `compile_layers_factor`: the
  training passes' time with that knob changed ÷ without, at the same budget;
- `generate_s_per_ktoken`: the rollout's seconds per thousand sampled tokens, by gpu_memory_utilization;
- `async_scheduling_factor`: the rollout's time with vLLM's async scheduling ÷ without, at the same
  gpu_memory_utilization;
- `keep_awake_factor`: the rollout's part of a step (weights pushed, generate, and the sleep and wakes around
  them) with vLLM kept awake (free_cache_engine false) ÷ asleep, at the same gpu_memory_utilization and async
  scheduling;
- `own_processes_factor`: the same part of a step with vLLM's engine core and model runner in processes of their
  own (distributed_executor_backend mp) ÷ in process, at the same gpu_memory_utilization and async scheduling;
- `training_spread`, `generate_spread`: how far repeated measurements scatter (launches of the same knobs:
  (max − min) ÷ max; in-process rounds: twice the median absolute deviation of each point's per-round ratio to
  its reference, relative): the tuner acts on no measured factor smaller than that (nor than TOLERANCE).

A plan gets the profile nearest its model's size; where that profile has one kind of terms only (its other bench
did not run, or ran on another GPU), it takes the other kind from the nearest profile that has them within the
tuner's reach, and says so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

COSTS_FILE = Path(__file__).resolve().parent / "tune_costs.json"
SCHEMA_VERSION = 1
# Two predictions closer than this are the same speed: it is the step-to-step spread within one run on these
# machines (docs/benchmarks.md: ±3%). Launches differ more (a profile's measured spreads); within the larger of
# the two the tuner keeps the cheaper-in-memory choice.
TOLERANCE = 0.03
SPREADS = ("training_spread", "generate_spread")
FACTORS = ("checkpointing_off_factor", "entropy_chunking_factor", "offload_factor", "compile_layers_factor",
           "async_scheduling_factor", "keep_awake_factor", "own_processes_factor")
# The generation's terms: measured by other benches than the training's, so a profile may lack one kind.
GENERATE_FACTORS = ("async_scheduling_factor", "keep_awake_factor", "own_processes_factor")


class CostFileError(ValueError):
    """tune_costs.json cannot be read as a cost table: what is wrong and where."""


@dataclass(frozen=True)
class Profile:
    device: str
    model: str
    num_params_b: float
    date: str
    command: str
    commit: str | None
    training_s_per_ktoken: tuple[tuple[float, float], ...] = ()  # (sequences per micro batch, s per 1k tokens)
    generate_s_per_ktoken: tuple[tuple[float, float], ...] = ()  # (gpu_memory_utilization, s per 1k tokens)
    factors: dict[str, float] = field(default_factory=dict)
    spreads: dict[str, float] = field(default_factory=dict)
    # Where the generation's terms came from when this profile measured none (CostTable.profile_for); else None.
    generation_from: Profile | None = None

    def times_off(self, num_params_b: float) -> float:
        """How many times larger or smaller than this profile's model a model of `num_params_b` is (≥ 1)."""
        return max(self.num_params_b / num_params_b, num_params_b / self.num_params_b)

    def has_generation(self) -> bool:
        return bool(self.generate_s_per_ktoken) or any(name in self.factors for name in GENERATE_FACTORS)

    def has_training(self) -> bool:
        return bool(self.training_s_per_ktoken) or any(name not in GENERATE_FACTORS for name in self.factors)

    def with_generation_of(self, other: Profile) -> Profile:
        """This profile's training terms and `other`'s generation ones (curve, factors, spread)."""
        factors = {k: v for k, v in self.factors.items() if k not in GENERATE_FACTORS}
        factors.update({k: v for k, v in other.factors.items() if k in GENERATE_FACTORS})
        spreads = {k: v for k, v in self.spreads.items() if k != "generate_spread"}
        spreads.update({k: v for k, v in other.spreads.items() if k == "generate_spread"})
        return replace(self, generate_s_per_ktoken=other.generate_s_per_ktoken, factors=factors, spreads=spreads,
                       generation_from=other)

    def tolerance(self, kind: str) -> float:
        """The smallest relative difference of `kind` ("training" or "generate") the tuner acts on."""
        return max(TOLERANCE, self.spreads.get(f"{kind}_spread", 0.0))

    def describe(self) -> str:
        text = f"{self.model} on {self.device}, {self.date} (`{self.command}`{f' at {self.commit}' if self.commit else ''})"
        if self.generation_from is not None:
            text += f"; its generation terms from {self.generation_from.describe()}"
        return text

    def training_time(self, micro_sequences: float) -> float | None:
        """Relative seconds per token of the training passes at this many sequences per micro batch
        (interpolated in log sequences between measured points, the end values beyond them)."""
        return _interpolate(self.training_s_per_ktoken, micro_sequences, log=True)

    def generate_time(self, utilization: float) -> float | None:
        return _interpolate(self.generate_s_per_ktoken, utilization, log=False)

    def factor(self, name: str) -> float | None:
        return self.factors.get(name)


def _interpolate(points: tuple[tuple[float, float], ...], x: float, log: bool) -> float | None:
    if not points:
        return None
    if x <= points[0][0]:
        return points[0][1]
    if x >= points[-1][0]:
        return points[-1][1]
    for (x0, y0), (x1, y1) in zip(points, points[1:]):
        if x0 <= x <= x1:
            if log:
                t = (math.log(x) - math.log(x0)) / (math.log(x1) - math.log(x0))
            else:
                t = (x - x0) / (x1 - x0)
            return y0 + t * (y1 - y0)
    return points[-1][1]


@dataclass(frozen=True)
class CostTable:
    path: Path
    profiles: tuple[Profile, ...]

    def profile_for(self, num_params_b: float | None, reach: float | None = None) -> Profile | None:
        """The profile of the nearest model size (by ratio), or None when there is none; of profiles as near, the
        one written last (write_profile appends: a remeasurement on another host of the same GPU, whose device
        string differs by its driver, supersedes the older one). A profile with one kind of terms only (its
        other bench did not run) takes the other kind from the nearest profile that has it, within `reach` × the
        model's size (None: any): a training-only profile does not hide another's generation curve, nor a
        generation-only one (measured on another GPU, say) another's training curve. The result is the training
        terms' profile, with `generation_from` naming where its generation terms came from."""
        if not self.profiles:
            return None
        if num_params_b is None or num_params_b <= 0:
            return self.profiles[-1]

        def nearest(profiles: list[Profile]) -> Profile | None:
            found = min(reversed(profiles), key=lambda p: p.times_off(num_params_b), default=None)
            return found if found is None or reach is None or found.times_off(num_params_b) <= reach else None

        chosen = min(reversed(self.profiles), key=lambda p: p.times_off(num_params_b))
        if not chosen.has_generation():
            donor = nearest([p for p in self.profiles if p.has_generation()])
            if donor is not None:
                chosen = chosen.with_generation_of(donor)
        elif not chosen.has_training():
            donor = nearest([p for p in self.profiles if p.has_training()])
            if donor is not None:
                chosen = donor.with_generation_of(chosen)
        return chosen


def load_costs(path: str | Path | None = None) -> CostTable:
    path = Path(path) if path is not None else COSTS_FILE
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        raise CostFileError(f"{path}: cannot be read ({exc})") from exc
    except json.JSONDecodeError as exc:
        raise CostFileError(f"{path}:{exc.lineno}: not JSON ({exc.msg})") from exc
    if data.get("schema_version") != SCHEMA_VERSION:
        raise CostFileError(f"{path}: schema_version {data.get('schema_version')!r}, expected {SCHEMA_VERSION}")
    profiles = []
    for index, raw in enumerate(data.get("profiles", [])):
        profiles.append(_profile(raw, f"{path}: profiles[{index}]"))
    return CostTable(path, tuple(profiles))


def _profile(raw: dict[str, Any], where: str) -> Profile:
    missing = [k for k in ("device", "model", "num_params_b", "date", "command", "terms") if k not in raw]
    if missing:
        raise CostFileError(f"{where}: missing {', '.join(missing)} (every profile says where its numbers come from)")
    terms = raw["terms"]
    if not isinstance(raw["num_params_b"], (int, float)) or raw["num_params_b"] <= 0:
        raise CostFileError(f"{where}.num_params_b: expected the model's size in billions (> 0), "
                            f"found {raw['num_params_b']!r}")

    def curve(name: str) -> tuple[tuple[float, float], ...]:
        points = terms.get(name) or []
        try:
            pairs = tuple(sorted((float(x), float(y)) for x, y in points))
        except (TypeError, ValueError) as exc:
            raise CostFileError(f"{where}.terms.{name}: expected [[x, seconds], ...], found {points!r}") from exc
        if any(y <= 0 for _, y in pairs):
            raise CostFileError(f"{where}.terms.{name}: seconds must be > 0, found {points!r}")
        return pairs

    factors = {}
    for name in FACTORS:
        value = terms.get(name)
        if value is not None:
            if not isinstance(value, (int, float)) or value <= 0:
                raise CostFileError(f"{where}.terms.{name}: expected a positive ratio, found {value!r}")
            factors[name] = float(value)
    spreads = {}
    for name in SPREADS:
        value = terms.get(name)
        if value is not None:
            if not isinstance(value, (int, float)) or not 0 <= value < 1:
                raise CostFileError(f"{where}.terms.{name}: expected a relative spread in [0, 1), found {value!r}")
            spreads[name] = float(value)
    return Profile(device=str(raw["device"]), model=str(raw["model"]), num_params_b=float(raw["num_params_b"]),
                   date=str(raw["date"]), command=str(raw["command"]), commit=raw.get("commit"),
                   training_s_per_ktoken=curve("training_s_per_ktoken"),
                   generate_s_per_ktoken=curve("generate_s_per_ktoken"), factors=factors, spreads=spreads)


def write_profile(profile: dict[str, Any], path: str | Path | None = None) -> Path:
    """Add (or replace: same device and model) a measured profile in the cost file, checked as load_costs reads it."""
    path = Path(path) if path is not None else COSTS_FILE
    data = json.loads(path.read_text()) if path.is_file() else {"schema_version": SCHEMA_VERSION, "profiles": []}
    _profile(profile, f"{path}: the new profile")
    data["profiles"] = [p for p in data.get("profiles", [])
                        if (p.get("device"), p.get("model")) != (profile["device"], profile["model"])] + [profile]
    path.write_text(json.dumps(data, indent=2) + "\n")
    load_costs(path)
    return path
