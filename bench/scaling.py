"""GRPO steps on one GPU and on two, side by side in one run, through `rlconf launch` (Ray placement
groups, FSDP over NCCL, vLLM rollout in the workers).

    python bench/scaling.py [--model random://Qwen2.5-0.5B] [--steps 5] [--configs 1gpu,2gpu_tp1,2gpu_tp2]
                            [--rounds 1] [--run-timeout-s 400] [--budget-s S] [key=value ...]

The workload per GPU is bench/grpo_vs_trl.py's (8 prompts × 8 samples × 512 tokens, bf16, gradient
checkpointing, vLLM with CUDA graphs at gpu_memory_utilization 0.3, `ignore_eos`); with two GPUs the
batch doubles (16 prompts a step: weak scaling, the same sequences per GPU), still one optimizer step
a GRPO step. Configurations:

- 1gpu: one actor rank, one vLLM replica;
- 2gpu_tp1: FSDP over 2 ranks, two vLLM replicas (tensor_model_parallel_size 1);
- 1gpu_mp, 2gpu_tp1_mp: 1gpu and 2gpu_tp1 with vLLM in processes of its own (distributed_executor_backend mp);
- 2gpu_tp2: FSDP over 2 ranks, one vLLM replica over both (tensor_model_parallel_size 2);
- 2gpu_offpolicy: one-step off-policy, one GPU training and one GPU of a rollout pool generating (NCCL push);
- 2gpu_fullasync, 2gpu_partial: the same two pools in the fully async schedule (docs/off-policy.md: weights every
  step, at most one step stale, verl's default of 16 groups in flight per replica: a step's whole share), without
  and with partial rollouts; each group streams to the trainer when its last response ends;
- 2gpu_fullasync_calls4, 2gpu_partial_calls4: the same with 4 groups in the replica's engine at once (a finished
  group's place goes to the next; before 2026-11-28 these were calls of 4 groups run one after another, which the
  runs recorded in docs/benchmarks.md before that date measured).
`--strong` keeps 8 prompts a step on two GPUs instead.

Each runs `python -m rlconf launch presets/quickstart.yaml <overrides>` in a fresh process; step
times are medians after the first step. Completion tokens/s = sampled tokens a step ÷ step seconds.
The placement each rank got (Ray node, GPU ids) is read from the run's workers.json. Every step's
rollout log-prob gap and PPO-ratio statistics (`learning`) are kept beside the timings. Prints a table
last; writes scaling.json (and each launch's log) under --out (else $OUT, else a temp dir), again after every launch.

`--rounds N` launches every configuration N times, interleaved (round 1 in --configs' order, round 2 reversed, ...),
because vLLM's engine step runs at a different speed in different processes (one 1-GPU launch generated in 2.54 s a
step, another in 1.9 s): a configuration's step, quartiles and tokens/s are then over the steady steps of all its
rounds pooled, scaling.json keeps each launch's own figures under `rounds`, and each ratio line adds every round's own
ratio (round k's configuration over round k's 1gpu), to show whether it holds from round to round.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from out_dir import out_dir  # noqa: E402
from watched_launch import steady_records, watched_launch  # noqa: E402

from grpo_vs_trl import PROMPTS, RESPONSE_TOKENS, SAMPLES, plan_overrides  # noqa: E402

CONFIGS = {"1gpu": (1, 1), "2gpu_tp1": (2, 1), "2gpu_tp2": (2, 2), "2gpu_offpolicy": (2, 1),  # name: (GPUs, rollout TP)
           "2gpu_fullasync": (2, 1), "2gpu_partial": (2, 1), "2gpu_fullasync_calls4": (2, 1),
           "2gpu_partial_calls4": (2, 1), "1gpu_mp": (1, 1), "2gpu_tp1_mp": (2, 1)}
# One-step off-policy (docs/off-policy.md): one GPU trains, one GPU of a rollout pool of its own generates the next
# step's batch meanwhile; weights go over NCCL. The same two GPUs and batch as 2gpu_tp1, which takes turns on both.
# The pool in verl's recipe spelling (top-level rollout.*): verl's one-step main_ppo copies these over
# actor_rollout_ref.rollout.nnodes / n_gpus_per_node, so bench/verl_offpolicy.py passes this list to verl as it is.
OFF_POLICY = ["actor_rollout_ref.hybrid_engine=false", "rollout.nnodes=1",
              "rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.free_cache_engine=false",
              "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
              "algorithm.rollout_correction.bypass_mode=true"]
# verl's fully async schedule on the same pools: a push every step, the pool at most one step ahead (as one-step
# off-policy); partial rollouts on or off; verl's concurrency (16 groups a replica) or 4 groups in the engine at once.
FULLY_ASYNC = ["async_training.trigger_parameter_sync_step=1", "async_training.staleness_threshold=1.0"]
CALLS4 = ["async_training.concurrent_samples_per_replica=4"]
# vLLM in processes of its own beside each actor worker (verl's layout; docs/architecture.md): the colocated step of
# 1gpu and 2gpu_tp1 otherwise. Its engine step's CPU work overlaps across three processes a replica.
MP = ["actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend=mp"]
LAYOUT_OVERRIDES = {"1gpu_mp": MP, "2gpu_tp1_mp": MP}
SCHEDULE_OVERRIDES = {"2gpu_offpolicy": OFF_POLICY,
                      "2gpu_fullasync": [*OFF_POLICY, *FULLY_ASYNC, "async_training.partial_rollout=false"],
                      "2gpu_partial": [*OFF_POLICY, *FULLY_ASYNC, "async_training.partial_rollout=true"],
                      "2gpu_fullasync_calls4": [*OFF_POLICY, *FULLY_ASYNC, *CALLS4, "async_training.partial_rollout=false"],
                      "2gpu_partial_calls4": [*OFF_POLICY, *FULLY_ASYNC, *CALLS4, "async_training.partial_rollout=true"]}


# offpolicy/*: the off-policy schedules' staleness, versions and (partial rollouts) resumed samples, step by step
LEARNING_KEYS = ("rollout/", "rollout_corr/", "actor/ppo_kl", "actor/pg_clipfrac", "offpolicy/")


@dataclass
class Round:
    """One launch of one configuration."""

    record: dict  # its figures, as scaling.json keeps them under the configuration's `rounds`
    metrics: list[dict] = field(default_factory=list)  # its metrics.jsonl steps (>= 1), for the pool; none if it failed


def config_shape(name: str, strong: bool) -> dict:
    """A configuration's GPUs, rollout tensor parallelism and prompts a step."""
    gpus, tp = CONFIGS[name]
    return {"gpus": gpus, "tp": tp, "prompts": PROMPTS if strong else PROMPTS * gpus}


def config_overrides(name: str, gpus: int, tp: int, prompts: int) -> list[str]:
    arr = "actor_rollout_ref"
    apart = name in SCHEDULE_OVERRIDES  # trainer.* then counts the training GPUs only; the rollout pool is the rest
    return [f"trainer.n_gpus_per_node={gpus - 1 if apart else gpus}", f"{arr}.rollout.tensor_model_parallel_size={tp}",
            f"data.train_batch_size={prompts}", f"{arr}.actor.ppo_mini_batch_size={prompts}",
            *SCHEDULE_OVERRIDES.get(name, []), *LAYOUT_OVERRIDES.get(name, [])]


def run_order(configs: list[str], rounds: int) -> list[tuple[int, str]]:
    """(round, configuration) in launch order: each configuration once a round, every even round in reverse."""
    # A, B, B, A, A, B, ...: in a fixed order one configuration would always be the call's first launch (onto a
    # machine just started: cold disk caches, Ray's first start) and the other always the one launched right after
    # its teardown; reversed every other round, each takes each place equally often over an even number of rounds,
    # and a steady drift of the host across the call falls on both sides alike in the pool. Round k's ratio still
    # pairs launches of one round, close in time.
    return [(number, name) for number in range(1, rounds + 1) for name in (configs if number % 2 else configs[::-1])]


def log_name(name: str, number: int, rounds: int) -> str:
    """A launch's log file: scaling_<config>.log as ever for one round, one file a round for several."""
    return f"scaling_{name}.log" if rounds == 1 else f"scaling_{name}_round{number}.log"


def step_spread(step_seconds: list[float]) -> tuple[float, float, float]:
    """(median, first quartile, third quartile) of steady step seconds; a lone step is its own spread."""
    # The spread of the timed steps: one slow generate moves a median of five steps (docs/benchmarks.md, "Weak
    # scaling with the fastest knobs"); the quartiles say how far.
    median = statistics.median(step_seconds)
    if len(step_seconds) < 2:
        return median, median, median
    q1, _, q3 = statistics.quantiles(step_seconds, n=4)
    return median, q1, q3


def estimate_over_peak(estimate: dict[str, float], peaks: dict[str, float | None]) -> dict[str, float]:
    """The plan's memory estimate ÷ the measured peak, for each phase that has both."""
    return {phase: estimate[phase] / peak for phase, peak in peaks.items() if peak and phase in estimate}


def steady_summary(warm: list[dict], prompts: int, estimate: dict[str, float]) -> dict:
    """The figures of steady steps of `prompts` prompts each: one launch's, or the pool of several launches' of the
    same plan (`estimate`: the launch's memory estimate, GiB a phase)."""
    step, q1, q3 = step_spread([m["timing/step"] for m in warm])
    sampled = prompts * SAMPLES * RESPONSE_TOKENS
    # Over the steps that have the key: off-policy's last step draws no next batch (no timing/data).
    keys = sorted({key for m in warm for key in m if key.startswith(("timing/", "rollout/", "memory/"))})
    med = {key: statistics.median(m[key] for m in warm if key in m) for key in keys}
    generate = med.get("timing/generate", med.get("timing/rollout_generate"))  # off-policy: the rollout pool's own
    peaks = {phase: max((m[key] for m in warm if key in m), default=None)
             for phase, key in (("training", "memory/actor_peak_gb"), ("rollout", "memory/rollout_peak_gb"))}
    return {"step_s": step, "step_s_quartiles": [q1, q3], "completion_tokens_per_s": sampled / step,
            "generate_tokens_per_s": sampled / generate if generate else None, "medians": med,
            "estimate_gib": estimate, "peak_gib": peaks, "estimate_over_peak": estimate_over_peak(estimate, peaks)}


def round_record(shape: dict, metrics: list[dict], placed: list[dict], estimate: dict[str, float], wall_s: float,
                 timed_out: bool) -> dict:
    """One launch's figures from its step records (`placed`: workers.json's actor ranks)."""
    warm = steady_records(metrics)
    per_step = {key: [round(m[key], 3) if key in m else None for m in warm]
                for key in sorted({key for m in warm for key in m if key.startswith("timing/")})}
    # Learning's health step by step, every step: the rollout/trainer log-prob gap and, in bypass mode, the PPO
    # ratio π_θ/π_rollout's statistics (its importance weight); rollout_corr/* where a plan turns correction on.
    learning = {key: [round(m[key], 5) if key in m else None for m in metrics]
                for key in sorted({k for m in metrics for k in m if k.startswith(LEARNING_KEYS)})}
    return {**shape, **steady_summary(warm, shape["prompts"], estimate), "steps": len(metrics),
            "placement": [{k: w[k] for k in ("rank", "node_id", "gpu_ids")} for w in placed], "wall_s": wall_s,
            "timed_out": timed_out, "steady_steps": [m["step"] for m in warm], "per_step": per_step,
            "learning": {"steps": [m["step"] for m in metrics], **learning}}


def pooled_record(shape: dict, rounds: list[Round]) -> dict:
    """A configuration over its rounds: the steady steps of every launch that measured some, pooled, and each
    launch's own record under `rounds` (in round order)."""
    measured = [number for number, launch in enumerate(rounds, 1) if "error" not in launch.record]
    records = [launch.record for launch in rounds]
    if not measured:
        errors = [record["error"] for record in records]
        error = errors[0] if len(errors) == 1 else "; ".join(f"round {k}: {e}" for k, e in enumerate(errors, 1))
        return {**shape, "error": error, "rounds": records}
    warm = [m for number in measured for m in steady_records(rounds[number - 1].metrics)]
    # Every round launches the same plan on the same kind of GPU, so its estimate is the same: the first one's.
    estimate = records[measured[0] - 1]["estimate_gib"]
    return {**shape, **steady_summary(warm, shape["prompts"], estimate), "pooled_rounds": measured,
            "rounds": records}


def throughput_ratio(base: dict, other: dict) -> tuple[float, float, float]:
    """`other`'s completion tokens/s ÷ `base`'s, and the low and high ends their step quartiles allow."""
    # The ratio again from the quartiles: the base at its q1 (fast) against the other at its q3 (slow) and the other
    # way round, the range one slow or fast stretch of steps could move it over.
    ratio = other["completion_tokens_per_s"] / base["completion_tokens_per_s"]
    low = (other["prompts"] / other["step_s_quartiles"][1]) / (base["prompts"] / base["step_s_quartiles"][0])
    high = (other["prompts"] / other["step_s_quartiles"][0]) / (base["prompts"] / base["step_s_quartiles"][1])
    return ratio, low, high


def round_ratios(base: dict, other: dict) -> list[float | None]:
    """Round k's ratio (`other`'s launch of round k ÷ `base`'s), from two pooled records; None where either failed."""
    return [throughput_ratio(one, two)[0] if "error" not in one and "error" not in two else None
            for one, two in zip(base["rounds"], other["rounds"])]


def run_config(name: str, model: str, steps: int, strong: bool, extra: list[str], timeout_s: float,
               log_path: Path) -> Round:
    shape = config_shape(name, strong)
    overrides = plan_overrides(model, steps) + config_overrides(name, **shape) + extra
    # The console goes to the log as it is printed (under --out): a launch killed at its time
    # limit leaves what it said and the steps it finished (bench/watched_launch.py).
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [sys.executable, "-m", "rlconf", "launch", str(ROOT / "presets" / "quickstart.yaml"), *overrides,
                   "--run-dir", str(run_dir)]
        run = watched_launch(command, run_dir, steps, timeout_s, log_path, ROOT)
        if len(run.records) < 2:  # no steady step to report
            log_text = log_path.read_text(errors="replace")
            return Round({"error": "timed out" if run.timed_out else f"exit {run.exit}", "steps": len(run.records),
                          "log_tail": log_text[-2000:], "traceback": run.traceback, "wall_s": run.wall_s})
        workers = run_dir / "workers.json"
        placed = json.loads(workers.read_text())["actor_rollout_ref"] if workers.is_file() else []
        resolved = run_dir / "plan.resolved.json"  # the launch's own estimate, for the GPU it ran on
        estimate = ({m["phase"]: m["total_gib"] for m in json.loads(resolved.read_text())["memory"]}
                    if resolved.is_file() else {})
    return Round(round_record(shape, run.records, placed, estimate, run.wall_s, run.timed_out), run.records)


MIN_LAUNCH_S = 60  # a launch given less never reaches its second step (Ray, the engine and vLLM start first)
TEARDOWN_S = 15  # what a launch killed at its limit takes to go, and the table to print, within --budget-s


def launch_limit(run_timeout_s: float, budget_s: float | None, elapsed_s: float) -> float | None:
    """The next launch's time limit: --run-timeout-s, cut to what --budget-s leaves (None: too little to start)."""
    if budget_s is None:
        return run_timeout_s
    left = budget_s - elapsed_s - TEARDOWN_S
    return min(run_timeout_s, left) if left >= MIN_LAUNCH_S else None


def launch_round(name: str, number: int, args: argparse.Namespace, timeout_s: float) -> Round:
    """run_config for one round, an exception it raises kept as that round's error: the other rounds still count."""
    try:
        return run_config(name, args.model, args.steps, args.strong, args.overrides, timeout_s,
                          args.out_dir / log_name(name, number, args.rounds))
    except Exception as exc:  # noqa: BLE001 - reported in scaling.json and the table, not lost with the other rounds
        return Round({"error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()[-4000:]})


RATIO_PAIRS = (("1gpu", "2gpu_tp1"), ("1gpu", "2gpu_tp2"), ("1gpu", "2gpu_offpolicy"), ("2gpu_tp1", "2gpu_offpolicy"),
               ("2gpu_tp1", "2gpu_fullasync"), ("2gpu_tp1", "2gpu_partial"), ("2gpu_fullasync", "2gpu_partial"),
               ("2gpu_offpolicy", "2gpu_fullasync"), ("2gpu_offpolicy", "2gpu_partial"),
               ("1gpu_mp", "2gpu_tp1_mp"), ("1gpu", "1gpu_mp"), ("2gpu_tp1", "2gpu_tp1_mp"))


def ratios(results: dict) -> dict[str, dict]:
    """Every ratio of completion tokens/s the run can give, keyed "<other> / <base>": the pooled ratio, its quartile
    range and each round's own (kept in scaling.json too: the printout may not survive a call cut short)."""
    found = {}
    for base_name, other_name in RATIO_PAIRS:
        base, other = results.get(base_name, {}), results.get(other_name, {})
        if "completion_tokens_per_s" in base and "completion_tokens_per_s" in other:
            ratio, low, high = throughput_ratio(base, other)
            found[f"{other_name} / {base_name}"] = {"ratio": ratio, "low": low, "high": high,
                                                    "by_round": round_ratios(base, other)}
    return found


def write_results(results: dict, out: Path) -> None:
    (out / "scaling.json").write_text(json.dumps(results, indent=2))


def rounds_text(ratios: list[float | None]) -> str:
    return ", by round " + " ".join("-" if ratio is None else f"{ratio:.2f}" for ratio in ratios)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random://Qwen2.5-0.5B")
    parser.add_argument("--steps", type=int, default=5)
    # The mp layout's configurations run only when named (no GPU run of that layout yet, 2026-11-28).
    parser.add_argument("--configs", default=",".join(name for name in CONFIGS if name not in LAYOUT_OVERRIDES))
    parser.add_argument("--strong", action="store_true", help="the same batch on two GPUs (strong scaling)")
    parser.add_argument("--rounds", type=int, default=1,
                        help="launch every configuration this many times, interleaved (A, B, B, A, ...); step times "
                             "pool the steady steps of all rounds")
    parser.add_argument("--run-timeout-s", type=float, default=400.0,
                        help="kill a launch (its whole process group) after this long; the steps it finished count")
    parser.add_argument("--budget-s", type=float, default=None,
                        help="the whole run's seconds (a device call's limit): each launch gets at most what is left, "
                             f"one with under {MIN_LAUNCH_S} s is skipped and says so")
    parser.add_argument("--out", default=None, help="where files go (default: $OUT, else a temp dir)")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides of every configuration's plan")
    args = parser.parse_args()
    args.out_dir = out_dir(args.out, "scaling_out_")
    configs = args.configs.split(",")
    unknown = [name for name in configs if name not in CONFIGS]
    if unknown:
        parser.error(f"--configs: unknown configuration(s) {', '.join(unknown)}; known: {', '.join(CONFIGS)}")
    if args.rounds < 1:
        parser.error(f"--rounds must be 1 or more, got {args.rounds}")
    launched: dict[str, list[Round]] = {name: [] for name in configs}
    results: dict = {}
    began = time.perf_counter()
    for number, name in run_order(configs, args.rounds):
        limit = launch_limit(args.run_timeout_s, args.budget_s, time.perf_counter() - began)
        launched[name].append(launch_round(name, number, args, limit) if limit is not None else
                              Round({"error": f"not launched: under {MIN_LAUNCH_S} s of --budget-s "
                                              f"{args.budget_s:.0f} left"}))
        print(name if args.rounds == 1 else f"{name} round {number}", json.dumps(launched[name][-1].record),
              flush=True)
        results = {name: pooled_record(config_shape(name, args.strong), rounds)
                   for name, rounds in launched.items() if rounds}
        results.update(model=args.model, date=time.strftime("%Y-%m-%d"),
                       scaling="strong" if args.strong else "weak", overrides=args.overrides, rounds=args.rounds)
        results["ratios"] = ratios(results)
        # After every launch: a later one that outlives the device call's limit does not take these with it.
        write_results(results, args.out_dir)
    import torch

    results.update(device=torch.cuda.get_device_name(0), gpus_seen=torch.cuda.device_count())
    write_results(results, args.out_dir)
    print(f"\n{results['device']}, {args.model}, {results['scaling']} scaling, {SAMPLES} samples × {RESPONSE_TOKENS} tokens")
    if args.rounds > 1:
        print(f"(step s, its quartiles and tokens/s over the steady steps of {args.rounds} rounds pooled; each "
              "round's own below)")
    print(f"{'config':<14} {'prompts':>7} {'step s':>7} {'(q1–q3)':>13} {'completion tok/s':>17} {'generate s':>10} "
          f"{'update s':>9} {'sync s':>7} {'trainer idle s':>14} {'rollout idle s':>14}")
    for name in configs:
        r = results[name]
        if "error" in r:
            print(f"{name:<10} failed: {r['error']}")
            continue
        med = r["medians"]
        # Idle: colocated, each side waits for the other's whole stage; off-policy, the measured waits.
        generate = med.get("timing/generate", med.get("timing/rollout_generate", float("nan")))
        trainer_idle = med.get("timing/wait_rollout", med.get("timing/generate", float("nan")))
        rollout_idle = med.get("timing/rollout_idle", r["step_s"] - med.get("timing/generate", float("nan")))
        q1, q3 = r.get("step_s_quartiles", [float("nan")] * 2)
        print(f"{name:<14} {r['prompts']:>7} {r['step_s']:7.2f} {f'({q1:.2f}–{q3:.2f})':>13} {r['completion_tokens_per_s']:17.0f} "
              f"{generate:10.2f} {med.get('timing/update_actor', float('nan')):9.2f} "
              f"{med.get('timing/weight_sync', float('nan')):7.3f} {trainer_idle:14.2f} {rollout_idle:14.2f}")
    if args.rounds > 1:
        print("\nby round: step s (q1–q3), completion tok/s, the rollout engine's step median s, launch wall s")
        for name in configs:
            for number, r in enumerate(results[name]["rounds"], 1):
                if "error" in r:
                    print(f"{name:<14} round {number}  failed: {r['error']}")
                    continue
                q1, q3 = r["step_s_quartiles"]
                engine_step = r["medians"].get("timing/rollout_engine_step_median", float("nan"))
                print(f"{name:<14} round {number}  {r['step_s']:7.2f} {f'({q1:.2f}–{q3:.2f})':>13} "
                      f"{r['completion_tokens_per_s']:17.0f} {engine_step:9.4g} {r['wall_s']:8.1f}")
    print("\nthe rollout engine (medians): its step, stalls, CPU and garbage-collector seconds, the slowest and fastest "
          "replica's generation (several GPUs); the memory estimate ÷ the measured peak (max over the timed steps)")
    for name in configs:
        r = results[name]
        if "error" in r:
            continue
        med = r["medians"]
        engine = "  ".join(f"{label} {med[key]:.4g}" for label, key in (
            ("step s", "timing/rollout_engine_step_median"), ("stalls s", "timing/rollout_engine_stalls"),
            ("cpu s", "timing/rollout_engine_cpu"), ("gc s", "timing/rollout_engine_gc"),
            ("slowest replica s", "timing/rollout_generate_in_worker"),
            ("fastest replica s", "timing/rollout_generate_in_worker_min")) if key in med)
        memory = "  ".join(f"{phase} {ratio:.3f}" for phase, ratio in r.get("estimate_over_peak", {}).items())
        print(f"{name:<14} engine: {engine or '-'}   estimate ÷ peak: {memory or '-'}")
    print("\nby step (all steps): rollout log-prob gap mean, its max; PPO ratio's KL and clip fraction")
    width = 14 if args.rounds == 1 else 18  # room for "2gpu_offpolicy r1"
    for name in configs:
        for number, record in enumerate(results[name]["rounds"], 1):
            label = name if args.rounds == 1 else f"{name} r{number}"
            learning = record.get("learning", {})
            for key in ("rollout/log_prob_diff_mean", "rollout/log_prob_diff_max", "actor/ppo_kl", "actor/pg_clipfrac"):
                if key in learning:
                    print(f"{label:<{width}} {key:<27} " + " ".join("-" if v is None else f"{v:.4f}" for v in learning[key]))
    for pair, found in results["ratios"].items():
        by_round = rounds_text(found["by_round"]) if args.rounds > 1 else ""
        if pair.endswith("/ 1gpu"):
            schedule = " (one-step off-policy against the synchronous step)" if "offpolicy" in pair else ""
            print(f"{pair} completion tokens/s: {found['ratio']:.2f} (quartile range {found['low']:.2f}–"
                  f"{found['high']:.2f}){by_round}{schedule}")
        else:
            print(f"{pair} (same GPUs, same batch) completion tokens/s: {found['ratio']:.2f}{by_round}")


if __name__ == "__main__":
    main()
