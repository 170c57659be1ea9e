"""rlconf's one-step off-policy beside verl 0.9.1's own (`verl.experimental.one_step_off_policy`), the same plan on
the same two GPUs in one call: one GPU trains, one GPU of a rollout pool of its own generates the next step's batch
meanwhile, and the trained weights go trainer → rollout over NCCL (docs/off-policy.md).

    python bench/verl_offpolicy.py [--model random://Qwen2.5-0.5B | random://Qwen2.5-1.5B] [--sides rlconf,verl]
        [--steps 5] [--verl-site /tmp/verlsite] [--budget-s 575] [--reserve-s 240] [--out DIR] [key=value ...]
    python bench/verl_offpolicy.py --check [--verl-site DIR]   # CPU: rlconf validates; verl composes (+ validates)
    python bench/verl_offpolicy.py --print-commands           # both command lines
    python bench/verl_offpolicy.py --report results.json      # the tables again, from a results file

Workload: bench/scaling.py's `2gpu_offpolicy` (bench/grpo_vs_trl.py's numbers, weak scaling to two GPUs): a
random-weight model of the real shape (`--model`, built once by rlconf into a directory that both sides get; its
tokenizer covers every id, bench/verl_side_by_side.py's prepare_model says why),
16 prompts × 8 samples × 512 sampled tokens a step (`ignore_eos`), bf16, gradient checkpointing, GRPO with one
optimizer step a step, micro batches of 16, vLLM with CUDA graphs at gpu_memory_utilization 0.3 on the rollout
GPU, bypass mode (π_old = the rollout's own log-probs). Data: the synthetic echo task as verl-schema parquet (the
rows `rlconf data synthetic` writes); reward: bench/verl_reward.py (the task's score in verl's custom-reward
signature) on both sides.

Sides, each in a fresh process group with a time limit:
- verl: `python -m verl.experimental.one_step_off_policy.main_ppo <SHARED>` from a directory holding only
  verl/trainer/config (a link: the recipe's config finds verl's ppo_trainer through `hydra.searchpath:
  file://verl/trainer/config`, a path relative to the working directory), verl's site folder first on the path
  and rlconf's tree off it; its steps are read from its console (`step:N - ... - timing_s/step:...`), and its
  process group is killed once the last one is printed (what follows is its shutdown).
- rlconf: `python -m rlconf launch <empty plan> <SHARED> --run-dir DIR` through bench/watched_launch.py
  (stopped by SIGTERM once its steps are in metrics.jsonl).
- rlconf_packed (not by default): the same plus `use_remove_padding=true`, the attention scaling.py's
  2gpu_offpolicy itself runs; packed against verl's padded is not like with like, and labelled so.

SHARED is one list (shared_overrides) given to both. Keys that differ, and why:
- On neither command line, verl's recipe default `actor_rollout_ref.rollout.calculate_log_probs: True`
  (one_step_off_ppo_trainer.yaml) applies to verl; rlconf accepts the key and does not need it (it asks vLLM for
  the log-probs whenever bypass mode needs them).
- free_cache_engine=false, checkpoint_engine.backend=nccl and rollout_correction.bypass_mode=true are verl's recipe
  defaults, written out in SHARED because rlconf's defaults are ppo_trainer's (verl's synchronous trainer's):
  without them rlconf warns (RL363-RL365) and would recompute π_old.
- The rollout pool is spelled `rollout.nnodes` / `rollout.n_gpus_per_node` (top level): verl's one-step main_ppo
  copies these over `actor_rollout_ref.rollout.*`, so the nested spelling would be overwritten by the recipe's
  default of 8 GPUs; rlconf reads the top-level spelling as the same keys.
- Padded attention on both (`use_remove_padding=false`, `+...override_config.attn_implementation=sdpa`): verl's
  packed path needs flash-attn 2, which has no wheel for the device image's torch.
- rlconf only: `--run-dir` and the empty plan file. verl only: its working directory (above).
Beyond SHARED each runs its own defaults: verl FSDP1 (`actor.strategy: fsdp`) with fp32 parameters and bf16
compute, `use_torch_compile`, vLLM as a server in its own Ray actor with 8 agent-loop workers; rlconf FSDP2 with
fp32 master weights and bf16 compute, vLLM inside the rollout worker. Against scaling.py's own 2gpu_offpolicy run
this plan differs only in the data (parquet, not synthetic://, and the seeds of its order), the reward (the same
scores, from the file) and the padded attention: tests/engine/test_bench_verl_offpolicy.py checks that the resolved
roles and schedule are equal.

Figures (medians of steps 2..N; step 1 waits for the first batch with nothing to overlap): step s, completion
tokens/s (sampled tokens a step ÷ step s), each side's own timers, the trainer's idle time (verl `timing_s/gen`,
its wait for the batch; rlconf `timing/wait_rollout`), the rollout pool's idle time (rlconf measures it:
`timing/rollout_idle`; verl does not report it, so its column is derived, marked ≈: step − generate_async −
sync_rollout_weights), response lengths (512 on both when ignore_eos holds), the time to the first step, each
GPU's peak used memory (nvidia-smi every 0.25 s), and rlconf ÷ verl completion tokens/s (issue 28 asks ≥ 1.0).
Every timing key of each side is in results.json and in the second table. Each console goes to
<out>/<side>.log; results.json and results.md are rewritten after every run.

On the device (`nvidia-h100-x2`, calls back to back while the machine stays warm; shared/device/README.md §1-2 and
§4 build .carry/c0-c3, .carry/verl and .carry/verl2). verl's NCCL checkpoint engine and Ray's NCCL collective
import CuPy, which neither verl folder has: build .carry/cupy once (52 MB) with

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \\
        --platform manylinux2014_x86_64 --platform any -d /tmp/cupy_whl cupy-cuda13x==14.2.0 'cuda-pathfinder>=1.3.4,<2'
    mkdir -p /tmp/cupy_site .carry/cupy && for w in /tmp/cupy_whl/*.whl; do unzip -q -o $w -d /tmp/cupy_site; done
    tar -C /tmp/cupy_site -cf - . | xz -T2 -9 > .carry/cupy/cupy.tar.xz

| call | carry | command |
|---|---|---|
| 1 | [".carry/c0"] | `mkdir -p /tmp/parts && cp .carry/c0/* /tmp/parts/` |
| 2 | [".carry/c1"] | `cp .carry/c1/* /tmp/parts/` |
| 3 | [".carry/c2"] | `cp .carry/c2/* /tmp/parts/` |
| 4 | [".carry/c3", ".carry/verl"] | `cp .carry/c3/* /tmp/parts/ && cat /tmp/parts/* > /tmp/b.tar.xz && mkdir -p /tmp/site /tmp/verlsite && tar -xJf /tmp/b.tar.xz -C /tmp/site && cp -r .carry/verl/* /tmp/verlsite/` |
| 5 | [".carry/verl2"] | `cp -r .carry/verl2/* /tmp/verlsite/` |
| 6 | [".carry/cupy"] | `tar -xJf .carry/cupy/cupy.tar.xz -C /tmp/verlsite` |
| 7 | [] | the command below |

    export PYTHONPATH=$PWD:/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1
    timeout 590 python bench/verl_offpolicy.py --model random://Qwen2.5-0.5B --steps 5 --verl-site /tmp/verlsite \\
        --budget-s 575 > $OUT/verl_offpolicy.txt 2>&1; echo "rc=$?" >> $OUT/verl_offpolicy.txt

(`--model random://Qwen2.5-1.5B` for the larger shape, in a call of its own.) Trailing `key=value` overrides go to
both sides alike, after the shared ones: `actor_rollout_ref.model.use_fused_kernels=true`, verl at its best here
(without flash-attn verl's engine worker computes log-probs one row of the logits at a time; its fused kernels
work from hidden states in chunks, and rlconf implements the key), or
`algorithm.rollout_correction.bypass_mode=false`, for verl's own rollout/trainer log-prob gap. A table of each side's
PPO-ratio KL, clip fraction, reward and log-prob gap step by step follows the timings. While rlconf runs, verl's config is
composed and checked by verl's validate_config, and a preflight imports verl's NCCL checkpoint engine in verl's
environment: verl is not started if it cannot run, and the output says why. A run gets at most what is left of
`--budget-s` minus `--reserve-s` for each run after it (and 60 s to wait for the GPUs to empty); one cut off
keeps the steps it printed. Were the cold start of both sides more than one call allows, `--sides rlconf` and
`--sides verl` in two calls on the same warm machine give both rows, and `--report a.json b.json` one table (not
one call, then: say so). The carried folders with the tree (about 3 MB) stay under a call's 64 MiB: 40, 47 and 55 MB.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from first_step import cache_sizes  # noqa: E402
from grpo_vs_trl import GPU_MEMORY_UTILIZATION, MICRO, PROMPTS, RESPONSE_TOKENS, SAMPLES  # noqa: E402
from scaling import CONFIGS, config_overrides  # noqa: E402
from verl_side_by_side import (  # noqa: E402
    PROMPT_TOKENS,
    REWARD_FILE,
    GpuSampler,
    fmt,
    prepare,
    run_side,
    steady_medians,
    verl_command,
    verl_config,
    verl_env,
    verl_workdir,
    wait_for,
    wait_gpu_free,
)
from watched_launch import watched_launch  # noqa: E402

CONFIG = "2gpu_offpolicy"
GPUS, ROLLOUT_TP = CONFIGS[CONFIG]
GPU_IDS = ",".join(str(i) for i in range(GPUS))
BATCH = PROMPTS * GPUS  # scaling.py's weak scaling: the one-GPU workload's prompts per GPU
MODEL = "random://Qwen2.5-0.5B"
VERL_ONE_STEP = ("verl.experimental.one_step_off_policy.main_ppo", "experimental/one_step_off_policy/config",
                 "one_step_off_ppo_trainer")
SIDES = ("rlconf", "verl", "rlconf_packed")
PACKED = ["actor_rollout_ref.model.use_remove_padding=true"]
# The same stage under each side's own timer: (verl's key, rlconf's key). None: that side does not report it.
STAGES = {
    "trainer_idle": ("timing_s/gen", "timing/wait_rollout"),
    "rollout_idle": (None, "timing/rollout_idle"),
    "generate": ("timing_s/generate_async", "timing/rollout_generate"),
    "sync": ("timing_s/sync_rollout_weights", "timing/weight_sync"),
    "update": ("timing_s/update_actor", "timing/update_actor"),
    "reward": ("timing_s/reward", "timing/reward"),
    "old_log_prob": ("timing_s/old_log_prob", "timing/old_log_prob"),
}
# Whether each side trained on what its own rollout sampled, step by step: (label, verl's key, rlconf's key). The PPO
# ratio's KL and clip fraction (π_θ against the batch's π_old: the rollout's own log-probs in bypass mode), the
# reward (the same file on both sides), and the rollout/trainer log-prob gap each side reports (verl only without
# bypass mode). On 2026-11-27 verl's ppo_kl was 5.7 nats a token in every step: these make such a run visible.
LEARNING = (
    ("ppo_kl", "actor/ppo_kl", "actor/ppo_kl"),
    ("pg_clipfrac", "actor/pg_clipfrac", "actor/pg_clipfrac"),
    ("reward mean", "critic/score/mean", "reward/mean"),
    ("log-prob gap", "training/rollout_probs_diff_mean", "rollout/log_prob_diff_mean"),
)
PREFLIGHT = """import sys
import torch
from verl.checkpoint_engine import CheckpointEngineRegistry
try:
    CheckpointEngineRegistry.get(sys.argv[1])
except ValueError as exc:
    sys.exit(f"verl's {sys.argv[1]} checkpoint engine does not import: {exc}")
from cupy.cuda import nccl
print(f"verl's {sys.argv[1]} checkpoint engine imports (cupy's NCCL {nccl.get_version()}, torch {torch.__version__})")
"""


def shared_overrides(model_dir: str, data_dir: str, steps: int, name: str, extra: list[str] = ()) -> list[str]:
    """The dotted overrides both commands get, in verl's spelling: the workload, then scaling.py's 2gpu_offpolicy,
    then `extra` (the command line's own, given to both sides alike: last, so they win)."""
    arr = "actor_rollout_ref"
    return [
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/val.parquet",
        f"data.max_prompt_length={PROMPT_TOKENS}", f"data.max_response_length={RESPONSE_TOKENS}",
        f"{arr}.model.path={model_dir}", f"{arr}.model.enable_gradient_checkpointing=true",
        f"{arr}.model.use_remove_padding=false",  # padded: verl's packed path needs flash-attn 2 (no wheel here)
        f"+{arr}.model.override_config.attn_implementation=sdpa",  # verl's default is flash_attention_2
        f"{arr}.actor.ppo_micro_batch_size_per_gpu={MICRO}", f"{arr}.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
        f"{arr}.actor.use_kl_loss=false", f"{arr}.actor.entropy_coeff=0", f"{arr}.actor.optim.lr=1e-6",
        f"{arr}.rollout.name=vllm", f"{arr}.rollout.n={SAMPLES}",
        f"{arr}.rollout.gpu_memory_utilization={GPU_MEMORY_UTILIZATION}", f"{arr}.rollout.enforce_eager=false",
        f"{arr}.rollout.ignore_eos=true",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
        f"reward.custom_reward_function.path={REWARD_FILE}", "reward.custom_reward_function.name=compute_score",
        "trainer.device=cuda", "trainer.nnodes=1", f"trainer.total_training_steps={steps}", "trainer.save_freq=-1",
        "trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.logger=[console]",
        "trainer.project_name=verl_offpolicy", f"trainer.experiment_name={name}",
        # trainer.n_gpus_per_node (the training GPUs), TP, the batch and the one-step keys (verl's recipe spelling)
        *config_overrides(CONFIG, GPUS, ROLLOUT_TP, BATCH),
        *extra,
    ]


def side_overrides(side: str, shared: list[str]) -> list[str]:
    return shared + PACKED if side == "rlconf_packed" else list(shared)


def commands(side: str, overrides: list[str], plan: Path, run_dir: Path) -> list[str]:
    """The command line of one side (verl's, as run_side runs it: from verl_workdir, with verl_env)."""
    if side == "verl":
        return verl_command(VERL_ONE_STEP, overrides)
    return [sys.executable, "-m", "rlconf", "launch", str(plan), *overrides, "--run-dir", str(run_dir)]


def experiment_name(model: str) -> str:
    return f"{CONFIG}_{model.rsplit('/', 1)[-1]}"


# --- runs ----------------------------------------------------------------------------------------


def verl_preflight(verl_site: str) -> tuple[bool, str]:
    """Whether verl's NCCL checkpoint engine imports in verl's environment (it needs CuPy), and what it said."""
    with tempfile.TemporaryDirectory() as tmp:
        try:
            proc = subprocess.run([sys.executable, "-c", PREFLIGHT, "nccl"], cwd=verl_workdir(Path(tmp), verl_site),
                                  capture_output=True, text=True, env=verl_env(verl_site), timeout=300)
        except subprocess.TimeoutExpired:
            return False, "the preflight's imports took more than 300 s"
    return proc.returncode == 0, (proc.stdout + proc.stderr).strip()[-2000:]


def run_rlconf(side: str, overrides: list[str], out: Path, timeout_s: float, steps: int, wait_free: bool) -> dict:
    """`rlconf launch` watched (bench/watched_launch.py), both GPUs' memory sampled meanwhile; `wait_free`: then wait
    for the GPUs to empty, for the run after it."""
    log_path = out / f"{side}.log"
    with tempfile.TemporaryDirectory(prefix=f"voff_{side}_") as tmp:
        plan = Path(tmp) / "plan.yaml"
        plan.write_text("# every setting comes from the command's overrides\n{}\n")
        run_dir = Path(tmp) / "run"
        command = commands(side, overrides, plan, run_dir)
        caches = cache_sizes()
        print(f"--- {side}: {' '.join(command[1:])}", flush=True)
        sampler = GpuSampler(gpus=GPU_IDS)
        run = watched_launch(command, run_dir, steps, timeout_s, log_path, ROOT)
        peak = sampler.stop()
        result = {"side": side, "command": command[1:], "overrides": overrides, "exit": run.exit,
                  "timed_out": run.timed_out, "stopped_after_last_step": run.stopped_after_last_step,
                  "wall_s": run.wall_s, "time_to_first_step_s": run.first_step_s, "device_peak_used_gib": peak,
                  "device_peak_used_gib_per_gpu": sampler.per_gpu_gib() if peak is not None else None,
                  "cache_bytes_before": caches, "log": log_path.name, "steps": run.records}
        resolved = run_dir / "plan.resolved.json"
        if resolved.is_file():
            shutil.copy(resolved, out / f"{side}.plan.resolved.json")
            result["estimate_gib"] = {m["phase"]: m["total_gib"] for m in json.loads(resolved.read_text())["memory"]}
        if run.traceback:
            result["error_log"] = run.traceback
    result["gpu_used_gib_after"] = wait_gpu_free(gpus=GPU_IDS) if wait_free else None
    if len(run.records) < 2:
        result["log_tail"] = log_path.read_text(errors="replace")[-4000:]
    return result


def summarize(result: dict) -> dict:
    """The steady medians and the figures of the tables."""
    steps = result.get("steps") or []
    if not steps:
        return {}
    verl = result["side"] == "verl"
    warm, med = steady_medians(steps)
    step_s = med.get("timing_s/step" if verl else "timing/step")
    stages = {}
    for stage, (verl_key, rlconf_key) in STAGES.items():
        key = verl_key if verl else rlconf_key
        stages[stage] = med.get(key) if key else None
    if verl and step_s is not None and stages["generate"] is not None:
        # verl does not time the rollout pool's wait: in a steady step the pool generates the next batch, takes the
        # weights, and waits for the rest of the step.
        stages["rollout_idle"] = max(step_s - stages["generate"] - (stages["sync"] or 0.0), 0.0)
    prefix = "timing_s/" if verl else "timing/"
    summary = {"steps_run": len(steps), "steady_steps": len(warm), "step_s": step_s,
               "step_s_each": [s.get("timing_s/step" if verl else "timing/step") for s in steps], "stages": stages,
               "rollout_idle_derived": verl, "timings": {k: v for k, v in med.items() if k.startswith(prefix)},
               "response_length_mean": med.get("response_length/mean"), "staleness": med.get("offpolicy/staleness"),
               "learning": learning(steps, verl)}
    if step_s:
        summary["completion_tokens_per_s"] = BATCH * SAMPLES * RESPONSE_TOKENS / step_s
    return summary


def learning(steps: list[dict], verl: bool) -> dict[str, list[float | None]]:
    """Each LEARNING figure of every step (None where the side did not report it that step)."""
    return {label: [step.get(verl_key if verl else rlconf_key) for step in steps]
            for label, verl_key, rlconf_key in LEARNING}


def learning_lines(results: dict) -> list[str]:
    """The LEARNING figures step by step, one row per side and figure (figures no step reported are left out)."""
    lines = []
    for side, run in results.get("runs", {}).items():
        for label, values in ((run.get("summary") or {}).get("learning") or {}).items():
            if any(v is not None for v in values):
                lines.append(f"| {side} | {label} | {' '.join(fmt(v, '.3g') for v in values)} |")
    if not lines:
        return []
    return ["", "What each side trained on, step by step (PPO ratio's KL and clip fraction, reward, rollout/trainer "
                "log-prob gap):", "", "| side | figure | steps 1..N |", "|---|---|---|", *lines]


def ratio(results: dict) -> float | None:
    """rlconf ÷ verl completion tokens/s (padded against padded); None unless both sides ran past step 1 (step 1
    waits for the first batch and compiles: a run cut off after it has no steady step to compare)."""
    if no_ratio_reason(results):
        return None
    runs = results.get("runs", {})
    ours, theirs = ((runs[side].get("summary") or {}).get("completion_tokens_per_s") for side in ("rlconf", "verl"))
    return ours / theirs if ours and theirs else None


def no_ratio_reason(results: dict) -> str:
    """Which side has no steady step to compare, in words ('' when both ran past step 1)."""
    runs = results.get("runs", {})
    reasons = []
    for side in ("rlconf", "verl"):
        steps_run = (runs.get(side, {}).get("summary") or {}).get("steps_run", 0)
        if steps_run < 2:
            reasons.append(f"{side} {'ran no step' if not steps_run else 'reached only step 1'}")
    return "; ".join(reasons)


# --- tables --------------------------------------------------------------------------------------


def tables(results: dict) -> str:
    head = ("| side | steps | step s (steps 2..N) | completion tok/s | trainer idle s | rollout idle s | generate s | "
            "update s | sync s | reward s | response length | time to step 1 s | peak GiB per GPU |")
    lines = [f"{results.get('model', '?')} on {results.get('device', 'no GPU seen')}, {BATCH} prompts × {SAMPLES} × "
             f"{RESPONSE_TOKENS} tokens a step, one-step off-policy on 1 + 1 GPUs", "", head,
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for side, run in results.get("runs", {}).items():
        s = run.get("summary") or {}
        label = side + (" (packed: not like with like)" if side == "rlconf_packed" else "")
        if not s:
            why = (f"not run: {run['skipped']}" if run.get("skipped") else
                   f"failed: {'timed out' if run.get('timed_out') else 'exit ' + str(run.get('exit'))}, "
                   f"{len(run.get('steps') or [])} step(s)")
            lines.append(f"| {label} | {why} |||||||||||")
            continue
        st = s["stages"]
        idle = fmt(st["rollout_idle"]) if st["rollout_idle"] is None or not s["rollout_idle_derived"] \
            else f"≈{st['rollout_idle']:.2f}"
        peaks = ", ".join(f"{gpu}: {gib:.1f}" for gpu, gib in (run.get("device_peak_used_gib_per_gpu") or {}).items())
        each = ", ".join(fmt(v) for v in s["step_s_each"])
        lines.append(f"| {label} | {s['steps_run']} | {fmt(s['step_s'])} ({each}) | "
                     f"{fmt(s.get('completion_tokens_per_s'), ',.0f')} | {fmt(st['trainer_idle'])} | {idle} | "
                     f"{fmt(st['generate'])} | {fmt(st['update'])} | {fmt(st['sync'], '.3f')} | {fmt(st['reward'])} | "
                     f"{fmt(s['response_length_mean'], '.1f')} | {fmt(run.get('time_to_first_step_s'), '.1f')} | "
                     f"{peaks or '-'} |")
    value = ratio(results)
    shown = f"{value:.2f}×" if value is not None else f"none ({no_ratio_reason(results) or 'a side has no figure'})"
    lines += ["", f"rlconf ÷ verl completion tokens/s (padded against padded): {shown} (issue 28 asks ≥ 1.0×)",
              *learning_lines(results), "",
              "Each side's own timers (medians of steps 2..N, seconds):", "", "| side | key | s |", "|---|---|---:|"]
    for side, run in results.get("runs", {}).items():
        for key, value in ((run.get("summary") or {}).get("timings") or {}).items():
            lines.append(f"| {side} | `{key}` | {value:.3f} |")
    return "\n".join(lines)


def write(results: dict, out: Path) -> None:
    results["rlconf_over_verl"] = ratio(results)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(tables(results) + "\n")


# --- checks on the CPU ---------------------------------------------------------------------------


def check(steps: int, verl_site: str, model: str, extra: list[str] = ()) -> int:
    """rlconf validates each side's overrides; verl composes its one-step config (and validates it where it imports)."""
    failed = 0
    shared = shared_overrides("/models/m", "/data", steps, experiment_name(model), extra)
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.yaml"
        plan.write_text("{}\n")
        for side in ("rlconf", "rlconf_packed"):
            proc = subprocess.run([sys.executable, "-m", "rlconf", "validate", str(plan), *side_overrides(side, shared)],
                                  cwd=ROOT, capture_output=True, text=True)
            print(f"rlconf validate ({side}): exit {proc.returncode}\n{proc.stdout}{proc.stderr}")
            failed += proc.returncode != 0
    if not (Path(verl_site) / "verl").is_dir():
        print(f"verl: no verl package in {verl_site} (--verl-site): not composed")
        return 1
    target = Path(tempfile.gettempdir()) / "verl_offpolicy_config.yaml"
    code, tail = verl_config(shared, verl_site, target, entry=VERL_ONE_STEP)
    print(f"verl compose + validate_config ({VERL_ONE_STEP[2]}): exit {code}\n{tail}")
    failed += code not in (0, 3)  # 3: composed; verl's own validation needs verl importable here
    return 1 if failed else 0


# --- main ----------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=MODEL, help="random://Qwen2.5-0.5B or random://Qwen2.5-1.5B (or a directory)")
    parser.add_argument("--sides", default="rlconf,verl", help=f"some of {','.join(SIDES)}, run in this order")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--verl-site", default="/tmp/verlsite", help="folder with verl 0.9.1, its packages and CuPy")
    parser.add_argument("--verl-ready", default=None, help="wait for this file before the verl run")
    parser.add_argument("--verl-ready-timeout-s", type=float, default=600)
    parser.add_argument("--budget-s", type=float, default=None, help="all runs end within this many seconds")
    parser.add_argument("--reserve-s", type=float, default=240, help="kept from a run's limit for each run after it")
    parser.add_argument("--run-timeout-s", type=float, default=480)
    parser.add_argument("--out", default=None, help="where files go (default: $OUT, else a temp dir)")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--print-commands", action="store_true")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides given to both sides alike (verl's "
                        "spelling), after the shared ones: e.g. actor_rollout_ref.model.use_fused_kernels=true")
    parser.add_argument("--report", nargs="+", default=None, metavar="RESULTS_JSON",
                        help="the tables again; several files (one side each, one machine) merge, a side of a later "
                             "file replacing the same side of an earlier one")
    args = parser.parse_args()
    sides = args.sides.split(",")
    unknown = sorted(set(sides) - set(SIDES))
    if unknown:
        parser.error(f"--sides: unknown {', '.join(unknown)}; choose from {', '.join(SIDES)}")
    if args.report:
        merged: dict = {}
        for path in args.report:
            part = json.loads(Path(path).read_text())
            merged = {**part, **merged, "runs": {**merged.get("runs", {}), **part.get("runs", {})}}
        for run in merged["runs"].values():
            run["summary"] = summarize(run)
        print(tables(merged))
        return
    if args.print_commands:
        shared = shared_overrides("$MODEL_DIR", "$DATA", args.steps, experiment_name(args.model), args.overrides)
        for side in sides:
            print(f"{side}:\n  {' '.join(commands(side, side_overrides(side, shared), Path('$PLAN'), Path('$RUN')))}")
        return
    if args.check:
        sys.exit(check(args.steps, args.verl_site, args.model, args.overrides))

    began = time.perf_counter()
    out = Path(args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="voff_out_"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.gettempdir()) / "verl_offpolicy"
    work.mkdir(exist_ok=True)
    model_dir, data_dir = prepare(work, args.model)
    shared = shared_overrides(model_dir, data_dir, args.steps, experiment_name(args.model), args.overrides)
    results: dict = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "date": time.strftime("%Y-%m-%d %H:%M"),
                     "model": args.model, "model_dir": model_dir, "data_dir": data_dir, "shared_overrides": shared,
                     "prepare_s": time.perf_counter() - began, "runs": {}}
    if shutil.which("nvidia-smi"):
        results["device"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                            "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    def limit_for(index: int) -> float:
        """This run's time limit: what the budget leaves after keeping reserve_s for each run after it, and the
        60 s a run before another may wait for the GPUs to empty."""
        if args.budget_s is None:
            return args.run_timeout_s
        left = args.budget_s - (time.perf_counter() - began)
        after = len(sides) - index - 1
        return min(args.run_timeout_s, left - args.reserve_s * after - (60 if after else 0))

    def skip(side: str, why: str, **more) -> None:
        results["runs"][side] = {"side": side, "skipped": why, **more}
        print(f"--- {side} not run: {why}", flush=True)
        write(results, out)

    def verl_checks() -> tuple[int, str, bool, str]:
        code, tail = verl_config(side_overrides("verl", shared), args.verl_site, out / "verl_config.yaml",
                                 entry=VERL_ONE_STEP)
        ready, said = verl_preflight(args.verl_site)
        return code, tail, ready, said

    # verl's checks import torch, verl and CuPy on the CPU (tens of seconds): while the runs before verl's go on,
    # unless verl's folder is still on its way (--verl-ready).
    early = None
    if "verl" in sides and not args.verl_ready:
        early = concurrent.futures.ThreadPoolExecutor(max_workers=1).submit(verl_checks)
    for index, side in enumerate(sides):
        overrides = side_overrides(side, shared)
        if side == "verl":
            if args.verl_ready and not wait_for(Path(args.verl_ready), args.verl_ready_timeout_s):
                skip(side, f"{args.verl_ready} did not appear")
                continue
            code, tail, ready, said = early.result() if early else verl_checks()
            print(f"verl config: exit {code}: {tail}\nverl preflight: {said}", flush=True)
            if not ready:
                skip(side, "preflight failed", preflight=said, config_exit=code)
                continue
        limit = limit_for(index)
        if limit < 60:
            skip(side, f"{limit:.0f} s of the budget left for it")
            continue
        last = index == len(sides) - 1
        if side == "verl":
            run = run_side("verl", overrides, out, side, limit, args.verl_site, entry=VERL_ONE_STEP, gpus=GPU_IDS,
                           stop_after_steps=args.steps, wait_free=not last)
            run.update(preflight=said, config_exit=code)
        else:
            run = run_rlconf(side, overrides, out, limit, args.steps, wait_free=not last)
        run["limit_s"] = limit
        run["summary"] = summarize(run)
        results["runs"][side] = run
        print(f"{side}: exit {run['exit']}, {run['summary'].get('step_s')} s/step, first step at "
              f"{run.get('time_to_first_step_s')} s", flush=True)
        write(results, out)
    write(results, out)
    print(tables(results))


if __name__ == "__main__":
    main()
