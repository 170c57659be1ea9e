"""Measure the cost terms of `rlconf tune`'s throughput model (rlconf/tune_costs.py) on this machine's GPU.

    python bench/tune_costs.py [--config 0.5b_1gpu] [--points budget_2,budget_8,budget_32,nockpt_8,util_0.3,util_0.7]
                               [--steps 3] [--budget-s 520] [--out DIR]
    python bench/tune_costs.py --fit DIR1/points.json [DIR2/points.json ...] [--write rlconf/tune_costs.json]
    python bench/tune_costs.py --device cpu --points budget_2,budget_8 --steps 2   # the pipeline, on CPU

Each point is one `rlconf launch` (bench/tune.py's launch: fresh process group, SIGTERM once every step is
in metrics.jsonl) of the configuration's workload (bench/tune.py's CONFIGS; the untuned plan) with
packing, dynamic batch size and gradient checkpointing on, `gpu_memory_utilization` 0.5 and one knob
set changed:

- `budget_K`: the actor's token budget K sequences (K × (prompt + response) tokens), the forward-only
  passes 2× it (the guide's ratio);
- `nockpt_K`, `chunk_K`, `offload_K`, `compile_K`: budget K with gradient checkpointing off, chunked entropy,
  parameter + optimizer offload, or each decoder layer compiled (`model.compile_layers`);
- `async_K`: budget K with vLLM's async scheduling (its generation against `budget_K`'s);
- `util_U`: budget 8 with `gpu_memory_utilization` U.

From each run (median of steps 2..N): the training passes' seconds (`timing/update_actor` +
`timing/old_log_prob`) per thousand tokens of the step (`perf/tokens`), and `timing/generate` per
thousand sampled tokens. points.json (under --out, else $OUT) is rewritten after every launch, so a
killed call keeps its points; it ends by fitting them into a profile (profile.json) in
rlconf/tune_costs.json's format with the device, date, command and commit. `--fit` does that step
alone, from one or more points.json files, and `--write` adds the profile to the cost file (the one the
tuner reads, by default): factors are ratios of two points of the same call; a term with no
measured point stays absent (the tuner then keeps the guide's choice for that knob).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from out_dir import out_dir  # noqa: E402

from tune import (ARR, COMMON, CONFIGS, CPU_CONFIGS, SAMPLES, Plan, _overrides_yaml, device_name, launch,  # noqa: E402
                  workload_yaml)

# Most useful first: --budget-s cuts the tail. No chunk_K: on CUDA the default loss head is the Triton one
# (use_torch_compile, rlconf/loss_head.py), beside which chunking does nothing (RL529) and the tuner never tries it;
# measure entropy_chunking_factor with `actor_rollout_ref.actor.use_torch_compile=false` given to every point.
# The first launch of a fresh machine pays its cold caches (minutes): budget_8 goes first, and nothing is measured
# against it alone. Below the smallest measured budget the tuner has no term (rlconf.tune), so budget_2 comes next.
DEFAULT_POINTS = "budget_8,budget_2,budget_32,nockpt_8,compile_8,async_8,util_0.3,util_0.7"
BASE_BUDGET, BASE_UTILIZATION = 8, 0.5
FACTOR_OF = {"nockpt": "checkpointing_off_factor", "chunk": "entropy_chunking_factor", "offload": "offload_factor",
             "compile": "compile_layers_factor"}
GENERATE_FACTOR_OF = {"async": "async_scheduling_factor"}  # ratios of generate_s_per_ktoken, not of training
KEEP_AWAKE_FACTOR = "keep_awake_factor"  # an -awake generation point's rollout rounds ÷ its asleep twin's
OWN_PROCESSES_FACTOR = "own_processes_factor"  # an -mp generation point's rollout rounds ÷ its in-process twin's
# A generation point that changes how the rollout's part of a round runs (its sleep and wakes, its processes): its
# factor against its twin (the same utilization and async scheduling, asleep and in process), never a curve point.
VARIANT_FACTORS = {"awake": KEEP_AWAKE_FACTOR, "own_processes": OWN_PROCESSES_FACTOR}
# vLLM 0.25 turns async scheduling on when it is unset and the executor supports it, as the engine's
# external_launcher one does (vllm/config/vllm.py): a point that leaves it unset already has it. Against such a
# point the async ones measured on against on (the shipped 0.5B profile's ×0.98, 2026-11-27); the points without
# it now turn it off by name, and the fit takes the factor only against one that did.
ASYNC_KEY = f"{ARR}.rollout.engine_kwargs.vllm.async_scheduling"
ASYNC_OFF = f"{ASYNC_KEY}=false"


def async_off(point: dict) -> bool:
    """Whether the point's engine ran with async scheduling turned off by name (its knobs say so)."""
    return ASYNC_OFF in (point.get("knobs") or [])


def point_overrides(point: str, sequence_tokens: int, device: str) -> list[str]:
    kind, _, value = point.partition("_")
    budget = BASE_BUDGET if kind == "util" else int(value)
    knobs = [f"{ARR}.model.use_remove_padding=true", f"{ARR}.model.enable_gradient_checkpointing=true",
             f"{ARR}.actor.use_dynamic_bsz=true", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=null",
             f"{ARR}.actor.ppo_max_token_len_per_gpu={budget * sequence_tokens}",
             f"{ARR}.rollout.log_prob_max_token_len_per_gpu={2 * budget * sequence_tokens}"]
    if device == "cuda":
        utilization = float(value) if kind == "util" else BASE_UTILIZATION
        knobs.append(f"{ARR}.rollout.gpu_memory_utilization={utilization}")
    if kind == "nockpt":
        knobs.append(f"{ARR}.model.enable_gradient_checkpointing=false")
    elif kind == "chunk":
        knobs.append(f"{ARR}.actor.entropy_from_logits_with_chunking=true")
    elif kind == "offload":
        knobs += [f"{ARR}.actor.fsdp_config.param_offload=true", f"{ARR}.actor.fsdp_config.optimizer_offload=true"]
    elif kind == "compile":
        knobs.append(f"{ARR}.model.compile_layers=true")
    elif kind not in ("budget", "util", "async"):
        raise ValueError(f"unknown point {point!r}: budget_K, nockpt_K, chunk_K, offload_K, compile_K, async_K or util_U")
    if device == "cuda":  # by name either way: unset, vLLM 0.25 turns it on (ASYNC_KEY)
        knobs.append(f"{ASYNC_KEY}={'true' if kind == 'async' else 'false'}")
    return knobs


def measured(run: dict, records_key: str = "stage_medians_s") -> dict:
    """Seconds per thousand tokens of the training passes and of generation, from bench/tune.py's launch()."""
    stages = run.get(records_key) or {}
    if "update_actor" not in stages or not run.get("tokens_median") or not run.get("steady_steps"):
        return {}  # no steady step (a launch cut after step 1, which pays for compiles): no terms
    training = stages["update_actor"] + stages.get("old_log_prob", 0.0)
    out = {"training_s_per_ktoken": training / (run["tokens_median"] / 1000)}
    if "generate" in stages and run.get("sampled_tokens"):
        out["generate_s_per_ktoken"] = stages["generate"] / (run["sampled_tokens"] / 1000)
    return out


def fit(points_files: list[Path]) -> dict:
    """A profile in rlconf/tune_costs.json's format from measured points (factors within one call).

    Training terms (the budget curve, the training factors, training_spread) come from the in-process calls
    (bench/tune_training_costs.py, `"measured": "in_process"`) when any are given, else from the launches;
    generation terms (the utilization curve, async scheduling's, keeping awake's and the own processes' factors, generate_spread)
    likewise from the in-process generation calls (bench/tune_generate_costs.py, `"terms": "generation"`), else from the launches."""
    calls = [json.loads(Path(f).read_text()) for f in points_files]
    measured_on = {(c["device"], c["model"]) for c in calls}
    if len(measured_on) > 1:  # one profile is one device and model shape
        raise SystemExit("these points were measured on more than one device or model: "
                         + "; ".join(f"{d} / {m}" for d, m in sorted(measured_on)))
    generation_in_process = [c for c in calls if c.get("terms") == "generation"]
    in_process = [c for c in calls if c.get("measured") == "in_process" and c.get("terms") != "generation"]
    if len({bool(c.get("workload", {}).get("parked")) for c in in_process}) > 1:
        # A parked point's passes start from an empty allocator cache each round: its absolute times are not an
        # unparked call's, and the budget curve takes them as they are.
        raise SystemExit("these training points mix a --park call with one without: fit each kind alone")
    launches = [c for c in calls if c.get("measured") != "in_process"]
    first = (launches or in_process or calls)[0]
    training: dict[float, list[float]] = {}
    generate: dict[float, list[float]] = {}
    factors: dict[str, list[float]] = {}
    for call in in_process or launches:
        points = {p["point"]: p for p in call["points"] if p.get("training_s_per_ktoken")}
        for name, p in points.items():
            kind, _, value = name.partition("_")
            if kind == "budget":
                training.setdefault(float(value), []).append(p["training_s_per_ktoken"])
            if kind in FACTOR_OF and f"budget_{value}" in points:
                base = points[f"budget_{value}"]
                factors.setdefault(FACTOR_OF[kind], []).append(
                    paired_ratio(p, base, "training_rounds") or p["training_s_per_ktoken"] / base["training_s_per_ktoken"])
    plain_kinds = {async_off(p) for c in generation_in_process for p in c["points"]
                   if p.get("utilization") is not None and not p.get("async_scheduling")}
    if len(plain_kinds) > 1:  # an unset engine ran with async scheduling on (vLLM 0.25): one curve, one setting
        raise SystemExit("these generation points mix engines that turned async scheduling off by name with ones "
                         "that left it unset (vLLM's default: on): fit each kind alone")
    for call in generation_in_process:
        measured = [p for p in call["points"] if p.get("generate_s_per_ktoken") and p.get("utilization") is not None]
        # An awake engine (free_cache_engine false) skips the sleep and wakes, an -mp one runs in processes of its
        # own: each its own factor, against its twin, over the rollout's whole part of a round.
        points = [p for p in measured if variant_of(p) is None]
        for p in measured:
            base = twin(p, points)
            ratio = paired_ratio(p, base, "rollout_rounds") if base is not None else None
            if ratio is not None:  # in-process points always have rounds; one without has nothing to pair
                factors.setdefault(VARIANT_FACTORS[variant_of(p)], []).append(ratio)
        plain = {p["utilization"]: p for p in points if not p["async_scheduling"] and async_off(p)}
        for p in points:
            if not p["async_scheduling"]:
                generate.setdefault(p["utilization"], []).append(p["generate_s_per_ktoken"])
            elif p["utilization"] in plain:  # against the engine without it at the same utilization, round by round
                base = plain[p["utilization"]]
                factors.setdefault(GENERATE_FACTOR_OF["async"], []).append(
                    paired_ratio(p, base, "generate_rounds") or p["generate_s_per_ktoken"] / base["generate_s_per_ktoken"])
    for call in [] if generation_in_process else launches:
        points = {p["point"]: p for p in call["points"] if p.get("generate_s_per_ktoken")}
        for name, p in points.items():
            kind, _, value = name.partition("_")
            if kind in ("budget", "util") and p.get("utilization") is not None:
                generate.setdefault(p["utilization"], []).append(p["generate_s_per_ktoken"])
            base = points.get(f"budget_{value}", {})
            base_generate = base.get("generate_s_per_ktoken") if async_off(base) else None
            if kind in GENERATE_FACTOR_OF and base_generate:
                factors.setdefault(GENERATE_FACTOR_OF[kind], []).append(p["generate_s_per_ktoken"] / base_generate)
    terms: dict = {
        "training_s_per_ktoken": [[k, round(statistics.median(v), 5)] for k, v in sorted(training.items())],
        "generate_s_per_ktoken": [[u, round(statistics.median(v), 5)] for u, v in sorted(generate.items())],
    }
    terms.update({name: round(statistics.median(v), 4) for name, v in factors.items()})
    terms.update(spreads(in_process or launches, generation_in_process or launches))
    return {"device": first["device"], "model": first["model"],
            "num_params_b": first.get("num_params_b") or calls[0]["num_params_b"], "date": first["date"],
            "command": " ; ".join(c["command"] for c in calls), "commit": first.get("commit"),
            "workload": first["workload"], "terms": terms}


def round_ratios(point: dict, base: dict, key: str) -> list[float]:
    """`point`'s time over `base`'s, round by round: the two ran in the same rounds of one process, so a slow
    stretch of the host (in-process generation landed 0.041 to 0.077 s per 1k tokens on one engine within one
    call, every engine alike) cancels in each round's ratio."""
    return [a / b for a, b in zip(point.get(key) or [], base.get(key) or []) if a > 0 and b > 0]


def paired_ratio(point: dict, base: dict, key: str) -> float | None:
    """The median of round_ratios, or None without paired rounds (launches)."""
    ratios = round_ratios(point, base, key)
    return statistics.median(ratios) if ratios else None


def ratio_spread(ratios: list[float]) -> float | None:
    """How far a paired ratio scatters between rounds: twice its median absolute deviation over its median. Robust
    to the one round in which compiled layers were still compiling a new shape (2.2× the others, 2026-11-27),
    which (max − min) ÷ max turned into a spread of 0.7 that would have hidden every factor."""
    if len(ratios) < 2:
        return None
    middle = statistics.median(ratios)
    return min(0.99, 2 * statistics.median(abs(r - middle) for r in ratios) / middle)


def in_process_spread(call: dict, key: str) -> float | None:
    """The widest ratio_spread of an in-process call's points against its reference point: for training, each
    factor point against the budget it changes and each budget against the largest; for generation, every engine
    asleep against the plain one at the lowest utilization, and an awake one against its asleep twin over the
    rollout's part of a round (the ratio keep_awake_factor is the median of)."""
    points = [p for p in call["points"] if p.get(key)]
    if key == "training_rounds":
        budgets = {p["point"]: p for p in points if p["point"].startswith("budget_")}
        largest = max(budgets.values(), key=lambda p: float(p["point"].partition("_")[2]), default=None)

        def reference(point: dict) -> dict | None:  # a budget: the largest; a factor point: its own budget
            kind, _, value = point["point"].partition("_")
            return largest if kind == "budget" else budgets.get(f"budget_{value}", largest)

        pairs = [(p, reference(p)) for p in points]
        extra: list[float | None] = []
    else:
        points = [p for p in points if p.get("utilization") is not None]  # the CPU pipeline's have none
        # An awake engine's generate leaves out the KV cache's wake, an -mp one's runs elsewhere, so their generate
        # rounds are not comparable to the others'; their own scatter is that of their ratio to their twin over the
        # rollout's part of a round.
        asleep = [p for p in points if variant_of(p) is None]
        plain = [p for p in asleep if not p.get("async_scheduling")]
        reference = min(plain, key=lambda p: p["utilization"], default=None)
        pairs = [(p, reference) for p in asleep]
        twins = [(p, twin(p, asleep)) for p in points if variant_of(p) is not None]
        extra = [ratio_spread(round_ratios(p, twin, "rollout_rounds")) for p, twin in twins if twin is not None]
    found = [ratio_spread(round_ratios(p, base, key)) for p, base in pairs if base is not None and p is not base]
    found = [f for f in (*found, *extra) if f is not None]
    return max(found) if found else None


def variant_of(point: dict) -> str | None:
    """Which of VARIANT_FACTORS' flags a generation point has set, if any."""
    return next((flag for flag in VARIANT_FACTORS if point.get(flag)), None)


def twin(point: dict, plain: list[dict]) -> dict | None:
    """A variant generation point's twin among the plain ones (the same utilization and async scheduling, asleep
    and in process), or None."""
    return next((q for q in plain if variant_of(point) is not None and q["utilization"] == point["utilization"]
                 and q["async_scheduling"] == point["async_scheduling"]), None)


def spreads(training_calls: list[dict], generation_calls: list[dict]) -> dict:
    """How far measurements of the same knobs landed apart, (max − min) ÷ max over each group of repeats (the
    widest group's), for the training passes and for generation: the tuner acts on no difference smaller.
    Launches of the same training knobs: budget_K, async_K (and util_U at budget 8); of the same generation:
    every point at the base utilization without async scheduling, and util_U at U. In-process calls: the scatter of
    their paired per-round ratios (in_process_spread), not of the rounds themselves, which drift with the host."""
    training: dict[tuple, list[float]] = {}
    generate: dict[tuple, list[float]] = {}
    paired = {"training_spread": [], "generate_spread": []}
    for calls, key, name in ((training_calls, "training_rounds", "training_spread"),
                             (generation_calls, "generate_rounds", "generate_spread")):
        for call in calls:
            if call.get("measured") == "in_process":
                found = in_process_spread(call, key)
                paired[name] += [] if found is None else [found]
    for call in training_calls:
        if call.get("measured") == "in_process":
            continue
        for p in call["points"]:
            if not p.get("training_s_per_ktoken"):
                continue
            kind, _, value = p["point"].partition("_")
            same_training = ("base", float(BASE_BUDGET if kind == "util" else value)) if kind in (
                "budget", "util", "async") else (kind, float(value))
            training.setdefault(same_training, []).append(p["training_s_per_ktoken"])
    for call in generation_calls:
        if call.get("measured") == "in_process":
            continue
        for p in call["points"]:
            if p.get("generate_s_per_ktoken") and p.get("utilization") is not None:
                generate.setdefault((p["utilization"], p["point"].startswith("async_")), []).append(
                    p["generate_s_per_ktoken"])

    def widest(groups: dict[tuple, list[float]]) -> float | None:
        # (max − min) ÷ max: how much faster the fastest repeat was than the slowest, always below 1 (÷ median
        # was not: one round still compiling a shape gave 2.3, a spread the cost file refuses).
        found = [(max(v) - min(v)) / max(v) for v in groups.values() if len(v) >= 2]
        return round(max(found), 4) if found else None

    out = {"training_spread": widest(training), "generate_spread": widest(generate)}
    for name, found in paired.items():
        if found:
            out[name] = round(max([*found, *([out[name]] if out[name] is not None else [])]), 4)
    return {k: v for k, v in out.items() if v is not None}


def commit() -> str | None:
    """BENCH_COMMIT when set (the lent GPU's copy of the tree may carry an older .git than its files), else HEAD."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"]
    try:
        proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return None
    return proc.stdout.strip() or None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--config", default=None, help="bench/tune.py's configuration (default 0.5b_1gpu; cpu: tiny_cpu)")
    parser.add_argument("--points", default=None, help=f"default {DEFAULT_POINTS} (cpu: budget_2,budget_8)")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gpu-memory", type=float, default=None, help="the plan's estimate.gpu_memory_gib")
    parser.add_argument("--budget-s", type=float, default=None)
    parser.add_argument("--min-run-s", type=float, default=80.0)
    parser.add_argument("--run-timeout-s", type=float, default=240.0)
    parser.add_argument("--out", default=None)
    parser.add_argument("--fit", nargs="+", default=None, metavar="POINTS_JSON", help="only fit these points files")
    parser.add_argument("--write", default=None, metavar="COSTS_JSON",
                        help="add the fitted profile to this cost file (rlconf/tune_costs.json for the tuner)")
    args = parser.parse_args(argv)
    from rlconf.tune_costs import write_profile

    out = out_dir(args.out, "bench_tune_costs_")
    out.mkdir(parents=True, exist_ok=True)
    if args.fit:
        profile = fit([Path(f) for f in args.fit])
    else:
        profile = measure(args, out)
        if profile is None:
            return 1
    if args.write and (lost := terms_it_would_lose(profile, Path(args.write))):
        parser.error(f"--write: the fit has no {' and no '.join(lost)} terms, which {args.write}'s profile of "
                     f"{profile['model']} on this device has (give points of both: launches, bench/tune_costs.py, or "
                     "in-process calls, bench/tune_training_costs.py and bench/tune_generate_costs.py, whose points ran)")
    (out / "profile.json").write_text(json.dumps(profile, indent=2) + "\n")
    print(json.dumps(profile, indent=2))
    if args.write:
        print(f"wrote the profile into {write_profile(profile, args.write)}")
    return 0


def terms_it_would_lose(profile: dict, costs_file: Path) -> list[str]:
    """The kinds of terms (training, generate) the cost file's profile of the same device and model has and this fit
    has not: write_profile replaces that whole profile, so writing would lose them. A fit of one kind for a new
    device or model loses nothing: the tuner keeps the guide's choice for the knobs the absent kind decides."""
    if not profile["terms"].get("training_s_per_ktoken") and not profile["terms"].get("generate_s_per_ktoken"):
        return ["training", "generate"]
    old = json.loads(costs_file.read_text()).get("profiles", []) if costs_file.is_file() else []
    same = [p for p in old if (p.get("device"), p.get("model")) == (profile["device"], profile["model"])]
    return [kind for kind in ("training", "generate") for p in same[-1:]
            if p.get("terms", {}).get(f"{kind}_s_per_ktoken") and not profile["terms"].get(f"{kind}_s_per_ktoken")]


def measure(args: argparse.Namespace, out: Path) -> dict | None:
    began = time.perf_counter()
    table = CPU_CONFIGS if args.device == "cpu" else CONFIGS
    name = args.config or ("tiny_cpu" if args.device == "cpu" else "0.5b_1gpu")
    config = table[name]
    points = (args.points or ("budget_2,budget_8" if args.device == "cpu" else DEFAULT_POINTS)).split(",")
    gpu_memory = args.gpu_memory or (24.0 if args.device == "cpu" else _local_gpu_gib())
    folder = out / "plans"
    folder.mkdir(parents=True, exist_ok=True)
    untuned = folder / "untuned.yaml"
    untuned.write_text(workload_yaml(config, gpu_memory))
    from rlconf.compile import compile_plan
    from rlconf.modelinfo import model_info
    from rlconf.tune import SAFETY, peak

    first = compile_plan(untuned, COMMON)
    if first.resolved is None:
        print("the workload does not compile: " + "; ".join(d.message for d in first.errors))
        return None
    norm = first.normalized
    seq = norm.rollout.prompt_length.value + norm.rollout.response_length.value
    info = model_info(config.model)
    record = {"command": " ".join(["bench/tune_costs.py", *(sys.argv[1:])]), "device": device_name() or args.device,
              "model": config.model.split("://")[-1], "num_params_b": float(f"{info.num_params / 1e9:.4g}"),
              "date": time.strftime("%Y-%m-%d"), "commit": commit(),
              "workload": {"config": name, "sequence_tokens": seq, "sequences_per_gpu": config.prompts * SAMPLES // config.gpus,
                           "gpus": config.gpus, "steps": args.steps, "common": COMMON},
              "points": []}
    for point in points:
        knobs = point_overrides(point, seq, config.device)
        path = folder / f"{point}.yaml"
        path.write_text(f"# bench/tune_costs.py's point {point}\nbase: untuned.yaml\n" + _overrides_yaml(knobs))
        plan = Plan(name, point, path, f"point {point}", knobs)
        left = None if args.budget_s is None else args.budget_s - (time.perf_counter() - began)
        entry: dict = {"point": point, "knobs": knobs,
                       "utilization": float(point.partition("_")[2]) if point.startswith("util_")
                       else (BASE_UTILIZATION if config.device == "cuda" else None)}
        compiled = compile_plan(path, COMMON)
        estimate = peak(compiled) if compiled.resolved is not None else None
        entry["estimate_gib"] = None if estimate is None else round(estimate, 2)
        if estimate is None:
            entry["skipped"] = "does not compile: " + "; ".join(d.message for d in compiled.errors)
        elif estimate * SAFETY > gpu_memory:
            entry["skipped"] = f"estimate {estimate:.1f} GiB × {SAFETY} over the GPU's {gpu_memory:g} GiB"
        elif left is not None and left < args.min_run_s:
            entry["skipped"] = f"budget: {max(left, 0):.0f} s left"
        else:
            timeout = args.run_timeout_s if left is None else min(args.run_timeout_s, left)
            print(f"--- {point}: launching (limit {timeout:.0f} s)", flush=True)
            run = launch(plan, args.steps, timeout, out / f"{point}.log", COMMON)
            if run.get("tokens_median") and run.get("response_length_mean"):
                run["sampled_tokens"] = config.prompts * SAMPLES * run["response_length_mean"]
            entry.update(run)
            entry.update(measured(run))
        record["points"].append(entry)
        (out / "points.json").write_text(json.dumps(record, indent=2) + "\n")
        print(f"    {json.dumps({k: entry.get(k) for k in ('training_s_per_ktoken', 'generate_s_per_ktoken', 'steady_step_s', 'oom', 'exit', 'skipped')})}",
              flush=True)
    return fit([out / "points.json"])


def in_process_arguments(argv: list[str] | None, description: str, default_points: str, cpu_points: str,
                         rounds: int, extra: Any = None) -> argparse.Namespace:
    """bench/tune_training_costs.py's and bench/tune_generate_costs.py's command line (one GPU, points in rounds);
    `extra(parser)` adds a bench's own options."""
    parser = argparse.ArgumentParser(description=description)
    if extra is not None:
        extra(parser)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--config", default=None, help="bench/tune.py's one-GPU configuration (default 0.5b_1gpu)")
    parser.add_argument("--points", default=None, help=f"default {default_points} (cpu: {cpu_points})")
    parser.add_argument("--rounds", type=int, default=rounds, help="timed rounds after the warm-up round")
    parser.add_argument("--gpu-memory", type=float, default=None)
    parser.add_argument("--out", default=None)
    args = parser.parse_args(argv)
    if args.rounds < 2:
        parser.error("--rounds: at least 2 (the spread between rounds is part of the result)")
    args.points = (args.points or (cpu_points if args.device == "cpu" else default_points)).split(",")
    return args


def write_round(out: Path, record: dict, entries: dict[str, dict], round_: int, kind: str) -> None:
    """After a timed round of an in-process bench: each point's median so far (`{kind}_s_per_ktoken` of its
    `{kind}_rounds`), points.json rewritten (a killed call keeps its rounds), one line printed."""
    for entry in entries.values():
        if entry[f"{kind}_rounds"]:
            entry[f"{kind}_s_per_ktoken"] = statistics.median(entry[f"{kind}_rounds"])
    record["points"] = list(entries.values())
    (out / "points.json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"round {round_}: " + ", ".join(f"{p} {e.get(f'{kind}_s_per_ktoken', float('nan')):.4f}"
                                          for p, e in entries.items()), flush=True)


def one_gpu_config(args: argparse.Namespace, cpu_config: Any) -> Any:
    """The configuration an in-process bench measures: bench/tune.py's, one GPU (its points share that GPU)."""
    config = cpu_config if args.device == "cpu" else CONFIGS[args.config or "0.5b_1gpu"]
    if config.gpus != 1:
        raise SystemExit(f"{args.config}: {config.gpus} GPUs; the in-process benches measure on one GPU")
    return config


def _local_gpu_gib() -> float:
    from rlconf.device import local_gpu

    gpu = local_gpu()
    if gpu is None:
        raise SystemExit("no GPU found by nvidia-smi: pass --gpu-memory, or --device cpu")
    return round(gpu.memory_gib, 1)


if __name__ == "__main__":
    sys.exit(main())
