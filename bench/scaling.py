"""GRPO steps on one GPU and on two, side by side in one run, through `rlconf launch` (Ray placement
groups, FSDP over NCCL, vLLM rollout in the workers).

    python bench/scaling.py [--model random://Qwen2.5-0.5B] [--steps 5] [--configs 1gpu,2gpu_tp1,2gpu_tp2]

The workload per GPU is bench/grpo_vs_trl.py's (8 prompts × 8 samples × 512 tokens, bf16, gradient
checkpointing, vLLM with CUDA graphs at gpu_memory_utilization 0.3, `ignore_eos`); with two GPUs the
batch doubles (16 prompts a step: weak scaling, the same sequences per GPU), still one optimizer step
a GRPO step. Configurations:

- 1gpu: one actor rank, one vLLM replica;
- 2gpu_tp1: FSDP over 2 ranks, two vLLM replicas (tensor_model_parallel_size 1);
- 2gpu_tp2: FSDP over 2 ranks, one vLLM replica over both (tensor_model_parallel_size 2);
- 2gpu_offpolicy: one-step off-policy, one GPU training and one GPU of a rollout pool generating (NCCL push).
`--strong` keeps 8 prompts a step on two GPUs instead.

Each runs `python -m rlconf launch presets/quickstart.yaml <overrides>` in a fresh process; step
times are medians after the first step. Completion tokens/s = sampled tokens a step ÷ step seconds.
The placement each rank got (Ray node, GPU ids) is read from the run's workers.json. Every step's
rollout log-prob gap and PPO-ratio statistics (`learning`) are kept beside the timings. Prints a table
last; writes scaling.json (and each launch's log) under $OUT when that is set.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from watched_launch import steady_records, watched_launch  # noqa: E402

from grpo_vs_trl import PROMPTS, RESPONSE_TOKENS, SAMPLES, plan_overrides  # noqa: E402

CONFIGS = {"1gpu": (1, 1), "2gpu_tp1": (2, 1), "2gpu_tp2": (2, 2), "2gpu_offpolicy": (2, 1)}  # name: (GPUs, rollout TP)
# One-step off-policy (docs/off-policy.md): one GPU trains, one GPU of a rollout pool of its own generates the next
# step's batch meanwhile; weights go over NCCL. The same two GPUs and batch as 2gpu_tp1, which takes turns on both.
# The pool in verl's recipe spelling (top-level rollout.*): verl's one-step main_ppo copies these over
# actor_rollout_ref.rollout.nnodes / n_gpus_per_node, so bench/verl_offpolicy.py passes this list to verl as it is.
OFF_POLICY = ["actor_rollout_ref.hybrid_engine=false", "rollout.nnodes=1",
              "rollout.n_gpus_per_node=1", "actor_rollout_ref.rollout.free_cache_engine=false",
              "actor_rollout_ref.rollout.checkpoint_engine.backend=nccl",
              "algorithm.rollout_correction.bypass_mode=true"]


LEARNING_KEYS = ("rollout/", "rollout_corr/", "actor/ppo_kl", "actor/pg_clipfrac")


def config_overrides(name: str, gpus: int, tp: int, prompts: int) -> list[str]:
    arr = "actor_rollout_ref"
    apart = name.endswith("offpolicy")  # trainer.* then counts the training GPUs only; the rollout pool is the rest
    return [f"trainer.n_gpus_per_node={gpus - 1 if apart else gpus}", f"{arr}.rollout.tensor_model_parallel_size={tp}",
            f"data.train_batch_size={prompts}", f"{arr}.actor.ppo_mini_batch_size={prompts}",
            *(OFF_POLICY if apart else [])]


def run_config(name: str, model: str, steps: int, strong: bool, extra: list[str], timeout_s: float) -> dict:
    gpus, tp = CONFIGS[name]
    prompts = PROMPTS if strong else PROMPTS * gpus
    overrides = plan_overrides(model, steps) + config_overrides(name, gpus, tp, prompts) + extra
    # The console goes to the log as it is printed (under $OUT when set): a launch killed at its time
    # limit leaves what it said and the steps it finished (bench/watched_launch.py).
    logs = Path(os.environ.get("OUT") or tempfile.gettempdir())
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        command = [sys.executable, "-m", "rlconf", "launch", str(ROOT / "presets" / "quickstart.yaml"), *overrides,
                   "--run-dir", str(run_dir)]
        run = watched_launch(command, run_dir, steps, timeout_s, logs / f"scaling_{name}.log", ROOT)
        wall = run.wall_s
        if len(run.records) < 2:  # no steady step to report
            log_text = (logs / f"scaling_{name}.log").read_text(errors="replace")
            return {"error": "timed out" if run.timed_out else f"exit {run.exit}", "steps": len(run.records),
                    "log_tail": log_text[-2000:], "traceback": run.traceback, "wall_s": wall}
        metrics = run.records
        workers = run_dir / "workers.json"
        placed = json.loads(workers.read_text())["actor_rollout_ref"] if workers.is_file() else []
        resolved = run_dir / "plan.resolved.json"  # the launch's own estimate, for the GPU it ran on
        estimate = ({m["phase"]: m["total_gib"] for m in json.loads(resolved.read_text())["memory"]}
                    if resolved.is_file() else {})
    warm = steady_records(metrics)
    step = statistics.median(m["timing/step"] for m in warm)
    # The spread of the timed steps: one slow generate moves a median of five steps (docs/benchmarks.md, "Weak
    # scaling with the fastest knobs"); the quartiles say how far.
    step_quartiles = (statistics.quantiles([m["timing/step"] for m in warm], n=4) if len(warm) >= 2
                      else [step, step, step])
    sampled = prompts * SAMPLES * RESPONSE_TOKENS
    # Over the steps that have the key: off-policy's last step draws no next batch (no timing/data).
    keys = sorted({key for m in warm for key in m if key.startswith(("timing/", "rollout/", "memory/"))})
    med = {key: statistics.median(m[key] for m in warm if key in m) for key in keys}
    per_step = {key: [round(m[key], 3) if key in m else None for m in warm] for key in keys if key.startswith("timing/")}
    # Learning's health step by step, every step: the rollout/trainer log-prob gap and, in bypass mode, the PPO
    # ratio π_θ/π_rollout's statistics (its importance weight); rollout_corr/* where a plan turns correction on.
    learning = {key: [round(m[key], 5) if key in m else None for m in metrics]
                for key in sorted({k for m in metrics for k in m if k.startswith(LEARNING_KEYS)})}
    generate = med.get("timing/generate", med.get("timing/rollout_generate"))  # off-policy: the rollout pool's own
    peaks = {phase: max((m[key] for m in warm if key in m), default=None)
             for phase, key in (("training", "memory/actor_peak_gb"), ("rollout", "memory/rollout_peak_gb"))}
    estimate_over_peak = {phase: estimate[phase] / peak for phase, peak in peaks.items() if peak and phase in estimate}
    return {"gpus": gpus, "tp": tp, "prompts": prompts, "step_s": step, "step_s_quartiles": [step_quartiles[0],
                                                                                          step_quartiles[2]],
            "completion_tokens_per_s": sampled / step,
            "generate_tokens_per_s": sampled / generate, "medians": med, "steps": len(metrics),
            "placement": [{k: w[k] for k in ("rank", "node_id", "gpu_ids")} for w in placed], "wall_s": wall,
            "timed_out": run.timed_out, "steady_steps": [m["step"] for m in warm], "per_step": per_step,
            "learning": {"steps": [m["step"] for m in metrics], **learning},
            "estimate_gib": estimate, "peak_gib": peaks, "estimate_over_peak": estimate_over_peak}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random://Qwen2.5-0.5B")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--strong", action="store_true", help="the same batch on two GPUs (strong scaling)")
    parser.add_argument("--run-timeout-s", type=float, default=400.0,
                        help="kill a launch (its whole process group) after this long; the steps it finished count")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides of every configuration's plan")
    args = parser.parse_args()
    results: dict = {}
    for name in args.configs.split(","):
        results[name] = run_config(name, args.model, args.steps, args.strong, args.overrides, args.run_timeout_s)
        print(name, json.dumps(results[name]), flush=True)
    import torch

    results.update(device=torch.cuda.get_device_name(0), gpus_seen=torch.cuda.device_count(), model=args.model,
                   date=time.strftime("%Y-%m-%d"), scaling="strong" if args.strong else "weak", overrides=args.overrides)
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "scaling.json").write_text(json.dumps(results, indent=2))
    print(f"\n{results['device']}, {args.model}, {results['scaling']} scaling, {SAMPLES} samples × {RESPONSE_TOKENS} tokens")
    print(f"{'config':<14} {'prompts':>7} {'step s':>7} {'(q1–q3)':>13} {'completion tok/s':>17} {'generate s':>10} "
          f"{'update s':>9} {'sync s':>7} {'trainer idle s':>14} {'rollout idle s':>14}")
    for name in args.configs.split(","):
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
    print("\nthe rollout engine (medians): its step, stalls, CPU and garbage-collector seconds; the memory estimate "
          "÷ the measured peak (max over the timed steps)")
    for name in args.configs.split(","):
        r = results[name]
        if "error" in r:
            continue
        med = r["medians"]
        engine = "  ".join(f"{label} {med[key]:.4g}" for label, key in (
            ("step s", "timing/rollout_engine_step_median"), ("stalls s", "timing/rollout_engine_stalls"),
            ("cpu s", "timing/rollout_engine_cpu"), ("gc s", "timing/rollout_engine_gc")) if key in med)
        memory = "  ".join(f"{phase} {ratio:.3f}" for phase, ratio in r.get("estimate_over_peak", {}).items())
        print(f"{name:<14} engine: {engine or '-'}   estimate ÷ peak: {memory or '-'}")
    print("\nby step (all steps): rollout log-prob gap mean, its max; PPO ratio's KL and clip fraction")
    for name in args.configs.split(","):
        learning = results[name].get("learning", {})
        for key in ("rollout/log_prob_diff_mean", "rollout/log_prob_diff_max", "actor/ppo_kl", "actor/pg_clipfrac"):
            if key in learning:
                print(f"{name:<14} {key:<27} " + " ".join("-" if v is None else f"{v:.4f}" for v in learning[key]))
    base = results.get("1gpu", {}).get("completion_tokens_per_s")
    for name in ("2gpu_tp1", "2gpu_tp2", "2gpu_offpolicy"):
        if base and "completion_tokens_per_s" in results.get(name, {}):
            schedule = " (one-step off-policy against the synchronous step)" if name.endswith("offpolicy") else ""
            # The ratio again from the quartiles: the 1-GPU run at its q1 (fast) against the 2-GPU run at its q3
            # (slow) and the other way round, the range one slow or fast stretch of steps could move it over.
            one, two = results["1gpu"], results[name]
            low = (two["prompts"] / two["step_s_quartiles"][1]) / (one["prompts"] / one["step_s_quartiles"][0])
            high = (two["prompts"] / two["step_s_quartiles"][0]) / (one["prompts"] / one["step_s_quartiles"][1])
            print(f"{name} / 1gpu completion tokens/s: {results[name]['completion_tokens_per_s'] / base:.2f} "
                  f"(quartile range {low:.2f}–{high:.2f}){schedule}")
    colocated = results.get("2gpu_tp1", {}).get("completion_tokens_per_s")
    if colocated and "completion_tokens_per_s" in results.get("2gpu_offpolicy", {}):
        print(f"2gpu_offpolicy / 2gpu_tp1 (same GPUs, same batch) completion tokens/s: "
              f"{results['2gpu_offpolicy']['completion_tokens_per_s'] / colocated:.2f}")


if __name__ == "__main__":
    main()
