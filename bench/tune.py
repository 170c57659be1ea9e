"""`rlconf tune` on GPUs: for each configuration, the untuned plan, the tuned plan and the best hand-tuned
settings we have, launched side by side in one call.

    python bench/tune.py [--configs 0.5b_1gpu,1.5b_1gpu] [--steps 4] [--rounds 1] [--budget-s 520] [--run-timeout-s 240]
                         [--variants untuned,tuned,hand] [--gpu-memory GiB] [--dry-run] [--out DIR]
    python bench/tune.py --device cpu [--steps 2]     # the quickstart's tiny model, 2 CPU workers: the pipeline

The workload of a configuration (random-weight Qwen2.5 shapes, GRPO on the synthetic task, n 8, prompts of up
to 16 tokens, 512 sampled tokens each with `ignore_eos`, bf16, vLLM at tensor parallel 1, no reference model;
with two GPUs twice the prompts: the same sequences per GPU) fixes every algorithmic number; the three
variants differ only in the per-GPU knobs:

- **untuned**: verl 0.9.1's defaults for the per-GPU knobs (rlconf's schema defaults are verl's: packing and
  gradient checkpointing on, fixed micro batches, `gpu_memory_utilization` 0.5, no offload), and for the
  micro batches verl leaves unset (null, required), the values of verl's quickstart
  (docs/start/quickstart.rst): `ppo_micro_batch_size_per_gpu=4`, `log_prob_micro_batch_size_per_gpu=8`.
- **tuned**: `rlconf tune untuned.yaml --gpu-memory G --write tuned.yaml` (G: --gpu-memory, else this
  machine's GPU from nvidia-smi).
- **hand**: the best hand-tuned knobs we have, HAND below with where they come from: the knobs of
  docs/benchmarks.md's fastest GRPO row (the "GRPO against TRL" table of the compiled-decoder-layers section,
  run 11), for every size (each configuration's plan is checked to fit before it launches).
- **hand_verl** (not run unless named in --variants): verl's own
  examples/tuning/7b/qwen2-7b_grpo_2_h800_fsdp_vllm.sh, the nearest of verl's tuning examples that is not LoRA
  (its 0.5B-7B ones are LoRA runs). It offloads parameters and optimizer: at 3B on one H100 its first step
  took 73 s (2026-11-27) against the tuned plan's 6.4 s, so it is the weaker of the two hand plans there.
- **tuned_awake** (not run unless named): the tuned plan with `free_cache_engine=false`, vLLM's weights and KV cache
  kept on the GPU while the actor trains (no sleep, no wake each step): a knob the tuner weighs and does not take
  beside the actor (rlconf.tune._keep_awake: its two measurements disagree), measured.
- **tuned_mp** (not run unless named): the tuned plan with vLLM's engine core and model runner in processes of
  their own (`distributed_executor_backend: mp`, verl's layout), against the tuned plan in process (once a
  profile has own_processes_factor the tuned plan may be mp already, and then the two are the same plan, as
  tuned_awake and a tuned plan kept awake are).
- A hand plan (or tuned_awake, tuned_mp) whose estimate × 1.15 is over the GPU is not launched (`_check`), as the tuner
  launches none.

Random-weight model directories are built before the first launch (build_models), outside any launch's limit.
Every launch also gets COMMON (no checkpoint, no validation) and `--steps` steps; use_torch_compile keeps
its default, which on CUDA runs the loss head's Triton kernels (rlconf/loss_head.py: nothing to compile). A launch is `python -m rlconf launch PLAN ... --run-dir DIR` in a fresh
process group; once metrics.jsonl holds every step the bench sends SIGTERM (the launch stops cleanly
and skips the final HF export), then kills the group after 60 s.

From each run: steady step = median `timing/step` of steps 2..N, completion tokens/s = sampled tokens
(train_batch_size × n × `response_length/mean`) ÷ steady step, `timing/startup_total` (the command to
step 1's metrics), the measured peaks `memory/actor_peak_gb` (training phase) and
`memory/rollout_peak_gb` (rollout phase), the estimate's peak per phase for the plan as launched, and
out of memory or not (the log or error.log). Writes, under --out (else $OUT): plans/<config>/*.yaml, one
runs/<config>__<variant>.json per run as it ends, tune.json (everything so far) and tune.md (the table
for docs/benchmarks.md, with tuned ÷ untuned and tuned ÷ hand), rewritten after every run: a killed call
keeps what finished. --budget-s: a run is started only if the time left covers --min-run-s, and each
run's limit is the lesser of --run-timeout-s and the time left.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
from out_dir import out_dir  # noqa: E402

from watched_launch import steady_records, watched_launch  # noqa: E402

ARR = "actor_rollout_ref"
SAMPLES, PROMPT_TOKENS, RESPONSE_TOKENS = 8, 16, 512
VARIANTS = ("untuned", "tuned", "hand")
ALL_VARIANTS = (*VARIANTS, "hand_verl", "tuned_awake", "tuned_mp")
# The knobs of the tuned_awake and tuned_mp experiments (TUNED_WITH)
AWAKE = f"{ARR}.rollout.free_cache_engine=false"
MP = f"{ARR}.rollout.engine_kwargs.vllm.distributed_executor_backend=mp"
# use_torch_compile stays at its default (true): on CUDA the loss head's Triton kernels, nothing to compile.
COMMON = ["trainer.save_freq=-1", "trainer.test_freq=-1", "trainer.val_before_train=false"]


@dataclass(frozen=True)
class Config:
    model: str  # a random:// shape (README: random-weight models of real shapes, no download)
    gpus: int
    prompts: int  # data.train_batch_size
    mini: int  # ppo_mini_batch_size, in prompts: two optimizer steps a training step, so π_old needs its pass
    hand: str  # key of HAND: the "hand" variant's knobs
    device: str = "cuda"


# Sequences per GPU: 128 (0.5B, 1.5B), 64 (3B), 32 (7B): the larger shapes take less so a step stays seconds.
CONFIGS = {
    "0.5b_1gpu": Config("random://Qwen2.5-0.5B", 1, 16, 8, "benchmarks_fastest"),
    "1.5b_1gpu": Config("random://Qwen2.5-1.5B", 1, 16, 8, "benchmarks_fastest"),
    "3b_1gpu": Config("random://Qwen2.5-3B", 1, 8, 4, "benchmarks_fastest"),
    "7b_1gpu": Config("random://Qwen2.5-7B", 1, 4, 2, "benchmarks_fastest"),
    "0.5b_2gpu": Config("random://Qwen2.5-0.5B", 2, 32, 16, "benchmarks_fastest"),
    "1.5b_2gpu": Config("random://Qwen2.5-1.5B", 2, 32, 16, "benchmarks_fastest"),
    "3b_2gpu": Config("random://Qwen2.5-3B", 2, 16, 8, "benchmarks_fastest"),
    "7b_2gpu": Config("random://Qwen2.5-7B", 2, 8, 4, "benchmarks_fastest"),
}
CPU_CONFIGS = {"tiny_cpu": Config("tiny://qwen2", 2, 16, 8, "quickstart_preset", device="cpu")}

# The hand-tuned settings, as overrides of the untuned plan, with where each set comes from.
HAND = {
    "benchmarks_fastest": (
        "docs/benchmarks.md, GRPO against TRL (compiled decoder layers), run 11: the fastest GRPO step measured",
        [f"{ARR}.model.use_remove_padding=true", f"{ARR}.actor.use_dynamic_bsz=true",
         f"{ARR}.actor.ppo_max_token_len_per_gpu=34816",  # (its chunked entropy: moot beside the Triton head, RL529)
         f"{ARR}.model.compile_layers=true", f"{ARR}.rollout.engine_kwargs.vllm.async_scheduling=true",
         f"{ARR}.rollout.gpu_memory_utilization=0.3"]),
    "verl_7b_h800": (
        "verl examples/tuning/7b/qwen2-7b_grpo_2_h800_fsdp_vllm.sh (nearest non-LoRA tuning example)",
        [f"{ARR}.model.use_remove_padding=true", f"{ARR}.model.enable_gradient_checkpointing=true",
         f"{ARR}.actor.ppo_micro_batch_size_per_gpu=16", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=16",
         f"{ARR}.actor.fsdp_config.param_offload=true", f"{ARR}.actor.fsdp_config.optimizer_offload=true",
         f"{ARR}.rollout.gpu_memory_utilization=0.6"]),
    "quickstart_preset": (
        "presets/quickstart.yaml's own per-GPU knobs (the nearest preset)",
        [f"{ARR}.actor.ppo_micro_batch_size_per_gpu=16", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=32",
         f"{ARR}.model.enable_gradient_checkpointing=false"]),
}
# verl's quickstart values for the micro batches verl 0.9.1 leaves null (and requires).
VERL_QUICKSTART_MICRO = {"ppo_micro_batch_size_per_gpu": 4, "log_prob_micro_batch_size_per_gpu": 8}


def workload_yaml(config: Config, gpu_memory_gib: float) -> str:
    """The untuned plan: the workload's algorithmic numbers, verl's defaults for every per-GPU knob."""
    mini_per_gpu = config.mini * SAMPLES // config.gpus
    micro = VERL_QUICKSTART_MICRO["ppo_micro_batch_size_per_gpu"]
    if mini_per_gpu % micro:
        raise ValueError(f"{config}: {mini_per_gpu} sequences a GPU per mini batch, not a multiple of verl's "
                         f"quickstart micro batch {micro}")
    if config.device == "cpu":  # the quickstart's model, data and CPU rollout; its knobs back at verl's defaults
        device = ["  device: cpu"]
        model = ["    path: tiny://qwen2", "    dtype: float32"]
        rollout = ["    name: hf", "    dtype: float32"]
        lengths = ("32", "4")
        extra_rollout: list[str] = []
    else:
        device = ["  device: cuda"]
        model = [f"    path: {config.model}", "    dtype: bfloat16"]
        rollout = ["    name: vllm", "    dtype: bfloat16", "    enforce_eager: false", "    ignore_eos: true"]
        lengths = (str(PROMPT_TOKENS), str(RESPONSE_TOKENS))
        extra_rollout = []
    lines = [
        f"# bench/tune.py's untuned plan: verl 0.9.1's defaults for the per-GPU knobs; micro batches from verl's "
        f"quickstart ({VERL_QUICKSTART_MICRO}).",
        "data:",
        "  train_files: synthetic://echo?size=2048&seed=0",
        "  val_files: synthetic://echo?size=64&seed=1",
        f"  max_prompt_length: {lengths[0]}",
        f"  max_response_length: {lengths[1]}",
        f"  train_batch_size: {config.prompts}",
        "  seed: 0",
        f"{ARR}:",
        "  model:", *model,
        "  actor:",
        f"    ppo_mini_batch_size: {config.mini}",
        f"    ppo_micro_batch_size_per_gpu: {micro}",
        "    use_kl_loss: false",
        "    entropy_coeff: 0.0",
        "    optim:",
        "      lr: 1.0e-6",
        "  rollout:", *rollout, *extra_rollout,
        f"    n: {SAMPLES}",
        "    tensor_model_parallel_size: 1",
        f"    log_prob_micro_batch_size_per_gpu: {VERL_QUICKSTART_MICRO['log_prob_micro_batch_size_per_gpu']}",
        "algorithm:",
        "  adv_estimator: grpo",
        "trainer:", *device,
        "  nnodes: 1",
        f"  n_gpus_per_node: {config.gpus}",
        "  total_training_steps: 4",
        "  logger: [console]",
        "  project_name: bench-tune",
        "  seed: 0",
        "estimate:",
        f"  gpu_memory_gib: {gpu_memory_gib:g}",
    ]
    return "\n".join(lines) + "\n"


@dataclass
class Plan:
    config: str
    variant: str
    path: Path
    source: str  # where the knobs come from, in words
    knobs: list[str] = field(default_factory=list)  # the per-GPU knobs that differ from the untuned plan
    ok: bool = True
    problem: str | None = None
    estimate_gib: dict[str, float] = field(default_factory=dict)  # phase (pool/phase) -> estimated GiB


def build_plans(name: str, config: Config, gpu_memory_gib: float, out: Path, variants: tuple[str, ...] = VARIANTS,
                common: list[str] | None = None) -> list[Plan]:
    """Write the config's plans under out/plans/<name>/ and check each compiles with no error (and, for the
    tuned one, that `rlconf tune` found a fit). Runs `rlconf tune --write` in a subprocess, as a user would."""
    common = COMMON if common is None else common
    folder = out / "plans" / name
    folder.mkdir(parents=True, exist_ok=True)
    untuned = folder / "untuned.yaml"
    untuned.write_text(workload_yaml(config, gpu_memory_gib))
    plans: list[Plan] = []
    for variant in variants:
        if variant == "untuned":
            plan = Plan(name, variant, untuned, f"verl 0.9.1 defaults; micro batches of verl's quickstart "
                                                f"{VERL_QUICKSTART_MICRO}")
        elif variant == "tuned":
            plan = _tuned_plan(name, untuned, folder / "tuned.yaml", gpu_memory_gib, common)
        elif variant in TUNED_WITH:
            plan = _tuned_with(variant, name, untuned, folder, gpu_memory_gib, common)
        elif variant in ("hand", "hand_verl"):
            source, knobs = HAND[config.hand if variant == "hand" else "verl_7b_h800"]
            path = folder / f"{variant}.yaml"
            path.write_text(f"# bench/tune.py's hand-tuned plan: {source}\nbase: untuned.yaml\n"
                            + _overrides_yaml(knobs))
            plan = Plan(name, variant, path, source, list(knobs))
        else:
            raise ValueError(f"unknown variant {variant!r}: use {', '.join(ALL_VARIANTS)}")
        if plan.ok:
            _check(plan, common, gpu_memory_gib)
        plans.append(plan)
    return plans


# Experiments on the tuned plan, each with one knob more: (the knob, what it is, why it is measured).
TUNED_WITH = {
    # vLLM kept awake while the actor trains: no sleep and no wake of its weights and KV cache each step (0.3-0.4 s
    # of a 5.4 s step at 7B on two H200s, 2026-11-28), its share held through the training phase instead. The
    # tuner weighs it and does not take it: 1.11x the tuned plan at 7B on two H200s, 1.04x at 1.5B on one H200 in
    # paired rounds (2026-11-28 night), within the launches' scatter.
    "tuned_awake": (AWAKE, "vLLM kept awake through training (free_cache_engine false)"),
    # vLLM's engine core and model runner in processes of their own (verl's layout): workload 1's generation alone
    # took 1.26 s that way against 2.23-2.32 s in process on one H200 (2026-11-28 night); the tuner takes it only from a
    # measured own_processes_factor.
    "tuned_mp": (MP, "vLLM in processes of its own (distributed_executor_backend mp)"),
}


def _tuned_with(variant: str, name: str, untuned: Path, folder: Path, gpu_memory_gib: float, common: list[str]) -> Plan:
    """The tuned plan (tuned.yaml, tuned first where no variant before did) with TUNED_WITH's knob for `variant`.
    Launched only where the estimate × the tuner's margin fits, as a hand plan."""
    knob, what = TUNED_WITH[variant]
    tuned = folder / "tuned.yaml"
    if not tuned.is_file():
        base = _tuned_plan(name, untuned, tuned, gpu_memory_gib, common)
        if not base.ok:
            return Plan(name, variant, tuned, base.source, ok=False, problem=base.problem)
    path = folder / f"{variant}.yaml"
    path.write_text(f"# bench/tune.py's tuned plan with {what} (an experiment)\nbase: tuned.yaml\n"
                    + _overrides_yaml([knob]))
    return Plan(name, variant, path, f"the tuned plan, {what}", [knob])


def _tuned_plan(name: str, untuned: Path, path: Path, gpu_memory_gib: float, common: list[str]) -> Plan:
    # The launches' common overrides go to the tuner too: the loss head's estimate depends on use_torch_compile.
    command = [sys.executable, "-m", "rlconf", "tune", str(untuned), *common, "--gpu-memory", f"{gpu_memory_gib:g}",
               "--write", str(path), "--format", "json"]
    proc = subprocess.run(command, cwd=ROOT, capture_output=True, text=True)
    (path.parent / "tune.json").write_text(proc.stdout)
    (path.parent / "tune.log").write_text(" ".join(command[1:]) + "\n" + proc.stderr)
    plan = Plan(name, "tuned", path, f"rlconf tune --gpu-memory {gpu_memory_gib:g} --write")
    try:
        answer = json.loads(proc.stdout)
    except json.JSONDecodeError:
        plan.ok, plan.problem = False, f"rlconf tune exited {proc.returncode}: {proc.stderr.strip()[-500:]}"
        return plan
    plan.knobs = answer["overrides"]
    plan.source += f" ({len(plan.knobs)} knobs: {answer.get('throughput_model', {}).get('state', 'no throughput model')})"
    if not answer["fits"] or not path.is_file():
        plan.ok, plan.problem = False, f"rlconf tune found no fit: {answer.get('why_not')}"
    return plan


def _overrides_yaml(overrides: list[str]) -> str:
    tree: dict = {}
    for text in overrides:
        key, _, value = text.partition("=")
        node = tree
        parts = key.split(".")
        for part in parts[:-1]:
            node = node.setdefault(part, {})
        node[parts[-1]] = value

    def lines(node: dict, indent: int) -> list[str]:
        out = []
        for key, value in node.items():
            if isinstance(value, dict):
                out += [" " * indent + f"{key}:", *lines(value, indent + 2)]
            else:
                out.append(" " * indent + f"{key}: {value}")
        return out

    return "\n".join(lines(tree, 0)) + "\n"


def _check(plan: Plan, common: list[str], gpu_memory_gib: float) -> None:
    """Compile the plan as it will be launched: errors make it unlaunchable; the estimate's peaks are kept. A hand
    plan must also fit as the tuner's do (estimate × SAFETY within the GPU): the best hand-tuned knobs *that fit*
    are the comparison; at 7B on one GPU the fastest row's knobs estimate 113.5 GiB, an out of memory that would
    only spend the call. The untuned plan launches whatever its estimate: verl's defaults are what they are."""
    from rlconf.compile import compile_plan
    from rlconf.tune import SAFETY

    result = compile_plan(plan.path, common)
    if result.resolved is None:
        plan.ok = False
        plan.problem = "; ".join(f"{d.code}: {d.message}" for d in result.errors) or "does not compile"
        return
    plan.estimate_gib = {f"{p.pool}/{p.phase}": round(p.total_gib, 4) for p in result.resolved.memory}
    warnings = [f"{d.code}" for d in result.warnings]
    if warnings:
        plan.source += f" (warnings: {', '.join(warnings)})"
    largest = max(plan.estimate_gib.values(), default=0.0)
    if (plan.variant.startswith("hand") or plan.variant in TUNED_WITH) and largest * SAFETY > gpu_memory_gib:
        plan.ok = False
        plan.problem = (f"the estimate, {largest:.1f} GiB × {SAFETY} safety, is over the GPU's {gpu_memory_gib:g} GiB: "
                        "these knobs do not fit this size")


# --- launching ------------------------------------------------------------------------------------------

OOM = re.compile(r"out of memory|OutOfMemoryError|CUDA error: out of memory", re.IGNORECASE)


def wait_for_idle_gpus(limit_s: float = 60.0, used_mib: float = 2048.0) -> float:
    """Seconds waited until every GPU holds less than `used_mib` (the last launch's workers gone): vLLM refuses to
    start when less than its gpu_memory_utilization share is free. 0 without nvidia-smi (CPU)."""
    import shutil

    if shutil.which("nvidia-smi") is None:
        return 0.0
    started = time.perf_counter()
    while time.perf_counter() - started < limit_s:
        out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                             capture_output=True, text=True).stdout.split()
        try:
            if all(float(v) < used_mib for v in out):
                break
        except ValueError:
            break
        time.sleep(2.0)
    return round(time.perf_counter() - started, 1)


def launch(plan: Plan, steps: int, timeout_s: float, log_path: Path, common: list[str]) -> dict:
    """One `rlconf launch` of the plan (bench/watched_launch.py: stopped by SIGTERM once `steps` steps are in
    metrics.jsonl, its process group killed at `timeout_s`). Returns what the run measured."""
    overrides = [*common, f"trainer.total_training_steps={steps}"]
    waited = wait_for_idle_gpus()
    with tempfile.TemporaryDirectory(prefix="bench_tune_") as tmp:
        run_dir = Path(tmp) / "run"
        command = [sys.executable, "-m", "rlconf", "launch", str(plan.path), *overrides, "--run-dir", str(run_dir)]
        run = watched_launch(command, run_dir, steps, timeout_s, log_path, ROOT)
    log_text = log_path.read_text(errors="replace")
    result: dict = {"exit": run.exit, "wall_s": run.wall_s, "timed_out": run.timed_out, "gpu_wait_s": waited,
                    "stopped_after_last_step": run.stopped_after_last_step, "steps_done": len(run.records),
                    "oom": bool(OOM.search(run.traceback) or OOM.search(log_text)), "log": log_path.name}
    if len(run.records) < steps:
        result["error_tail"] = (run.traceback or log_text)[-2000:]
    return {**result, **measure(run.records)}


def _stage_seconds(record: dict) -> dict[str, float]:
    """One metrics line's stage timers (timing/*, start-up's left out), by stage name."""
    return {key[len("timing/"):]: round(value, 3) for key, value in sorted(record.items())
            if key.startswith("timing/") and not key.startswith("timing/startup")}


def measure(records: list[dict]) -> dict:
    """Step time, throughput, start-up and peaks from a run's metrics.jsonl lines (step ≥ 1). A run that finished
    step 1 alone has no steady step (step 1 pays for compiles and caches: the 3B hand plan's 73 s, 2026-11-27, was
    its first step, cut by the time limit), so no step time or ratio: its peaks and stages stay."""
    if not records:
        return {}
    steps = [r["timing/step"] for r in records]
    warm = steady_records(records)
    sampled = statistics.median(r["response_length/mean"] for r in warm)
    out = {"step_s": [round(s, 3) for s in steps], "steady_steps": [r["step"] for r in warm if r["step"] > 1],
           "startup_total_s": records[0].get("timing/startup_total"), "response_length_mean": round(sampled, 1),
           "tokens_median": statistics.median(r.get("perf/tokens", 0) for r in warm)}
    stages = sorted({k for r in warm for k in r if k.startswith("timing/") and not k.startswith("timing/startup")})
    out["stage_medians_s"] = {k[len("timing/"):]: round(statistics.median(r[k] for r in warm if k in r), 3)
                              for k in stages if any(k in r for r in warm)}
    # Every step's own stages too: a step the median leaves out (the 7B tuned plan's step 2 took 4-5 s more than
    # its later steps in two launches, 2026-11-28) says where its time went only here.
    out["stages_by_step"] = [{"step": r["step"], "seconds": _stage_seconds(r)} for r in records]
    for key in ("memory/actor_peak_gb", "memory/rollout_peak_gb", "memory/rollout_device_used_gb"):
        values = [r[key] for r in records if key in r]
        if values:
            out[key.split("/")[1]] = round(max(values), 2)
    if out["steady_steps"]:
        out["steady_step_s"] = round(statistics.median(r["timing/step"] for r in warm), 3)
    return out


def finish(run: dict, plan: Plan, config: Config) -> dict:
    """Add throughput and the estimate against the measured peaks."""
    if "steady_step_s" in run:
        sequences = config.prompts * SAMPLES
        run["completion_tokens_per_s"] = round(sequences * run["response_length_mean"] / run["steady_step_s"], 1)
    training = max((v for k, v in plan.estimate_gib.items() if k.endswith("/training")), default=None)
    rollout = max((v for k, v in plan.estimate_gib.items() if k.endswith("/rollout")), default=None)
    run["estimate_training_gib"], run["estimate_rollout_gib"] = training, rollout
    if training and run.get("actor_peak_gb"):
        run["estimate_over_measured_training"] = round(training / run["actor_peak_gb"], 3)
    if rollout and run.get("rollout_peak_gb"):
        run["estimate_over_measured_rollout"] = round(rollout / run["rollout_peak_gb"], 3)
    return run


# --- the table ------------------------------------------------------------------------------------------

def _fmt(value, spec: str = ".2f") -> str:
    return "–" if value is None else format(value, spec)


def combine(rounds: list[dict]) -> dict:
    """One row out of a plan's rounds: the median step and throughput over the rounds that ran, the largest
    peaks (and the estimate against them), the first round's start-up; a single round as it is."""
    ran = [r for r in rounds if r.get("steady_step_s")]
    if len(rounds) == 1 or not ran:
        return rounds[-1]
    row = dict(ran[0])
    row["rounds_step_s"] = [r["steady_step_s"] for r in ran]
    row["steady_step_s"] = round(statistics.median(row["rounds_step_s"]), 3)
    row["completion_tokens_per_s"] = round(statistics.median(r["completion_tokens_per_s"] for r in ran), 1)
    row["oom"] = any(r.get("oom") for r in rounds)
    for peak, ratio, estimate in (("actor_peak_gb", "estimate_over_measured_training", "estimate_training_gib"),
                                  ("rollout_peak_gb", "estimate_over_measured_rollout", "estimate_rollout_gib")):
        peaks = [r[peak] for r in ran if r.get(peak)]
        if peaks:
            row[peak] = max(peaks)
            if row.get(estimate):
                row[ratio] = round(row[estimate] / row[peak], 3)
    return row


def tuned_over(tuned: list[dict], other: list[dict]) -> str:
    """The tuned plan's completion tok/s over another's: the median of the ratios of the rounds both ran, so a
    slow stretch of the host falls on both sides of each ratio (a round one of them missed says nothing)."""
    speeds = {r.get("round", 1): r["completion_tokens_per_s"] for r in tuned if r.get("completion_tokens_per_s")}
    ratios = [speeds[r.get("round", 1)] / r["completion_tokens_per_s"] for r in other
              if r.get("completion_tokens_per_s") and r.get("round", 1) in speeds]
    if not ratios:
        return "–"
    return f"{statistics.median(ratios):.2f}" + (f" ({len(ratios)} rounds)" if len(ratios) > 1 else "")


def table(runs: list[dict]) -> str:
    """docs/benchmarks.md's table: one row per plan (its rounds combined), ratios on the tuned rows."""
    rounds: dict[str, dict[str, list[dict]]] = {}
    for run in runs:
        rounds.setdefault(run["config"], {}).setdefault(run["variant"], []).append(run)
    by_config = {name: {variant: combine(runs_) for variant, runs_ in variants.items()}
                 for name, variants in rounds.items()}
    head = ("| config | variant | result | step s | completion tok/s | first step s | est training / rollout GiB "
            "| measured GiB | est ÷ measured | tuned ÷ this |")
    lines = [head, "|" + "---|" * 3 + "---:|" * 7]
    for name, variants in by_config.items():
        for variant in ALL_VARIANTS:
            run = variants.get(variant)
            if run is None:
                continue
            result = ("skipped: " + run["skipped"] if run.get("skipped") else "out of memory" if run.get("oom")
                      else "step 1 only (no steady step)" if run.get("steps_done") == 1
                      else "timed out" if run.get("timed_out") and not run.get("steady_step_s")
                      else f"failed (exit {run.get('exit')})" if "steady_step_s" not in run else "ran")
            if run.get("rounds_step_s"):
                result += f" ×{len(run['rounds_step_s'])}: " + ", ".join(f"{x:.2f}" for x in run["rounds_step_s"])
                oom = [str(r.get("round")) for r in rounds[name][variant] if r.get("oom")]
                result += f"; out of memory in round {', '.join(oom)}" if oom else ""
            speed = run.get("completion_tokens_per_s")
            ratio = "–" if variant == "tuned" else tuned_over(rounds[name].get("tuned", []), rounds[name][variant])
            measured = f"{_fmt(run.get('actor_peak_gb'))} / {_fmt(run.get('rollout_peak_gb'))}"
            est = f"{_fmt(run.get('estimate_training_gib'))} / {_fmt(run.get('estimate_rollout_gib'))}"
            ratio_est = (f"{_fmt(run.get('estimate_over_measured_training'))} / "
                         f"{_fmt(run.get('estimate_over_measured_rollout'))}")
            lines.append(f"| {name} | {variant} | {result} | {_fmt(run.get('steady_step_s'))} | "
                         f"{_fmt(speed, ',.0f')} | {_fmt(run.get('startup_total_s'), '.1f')} | {est} | {measured} | "
                         f"{ratio_est} | {ratio} |")
    return "\n".join(lines) + "\n"


def write_report(out: Path, report: dict) -> None:
    (out / "tune.json").write_text(json.dumps(report, indent=2) + "\n")
    header = [f"bench/tune.py: {report['command']}", f"device: {report.get('device', '?')}; date {report['date']}",
              "step s: median timing/step of steps 2..N; completion tok/s: train_batch_size × n × mean response "
              "length ÷ step s; first step s: timing/startup_total; est / measured GiB: training phase / rollout "
              "phase (memory/actor_peak_gb / memory/rollout_peak_gb); tuned ÷ this: the tuned plan's completion "
              "tok/s over this row's", ""]
    knobs = ["", "Knobs of each plan (besides the untuned plan):", ""]
    listed = set()
    for run in report["runs"]:
        if run["variant"] != "untuned" and (run["config"], run["variant"]) not in listed:
            listed.add((run["config"], run["variant"]))
            knobs.append(f"- {run['config']} {run['variant']} ({run['source']}): "
                         + (", ".join(f"`{k}`" for k in run["knobs"]) or "none"))
    (out / "tune.md").write_text("\n".join(header) + table(report["runs"]) + "\n".join(knobs) + "\n")


def launch_order(plans: list[Plan], rounds: int) -> list[tuple[int, Plan]]:
    """(round, plan) in launch order. Rounds run every plan once before any runs twice: launches scatter more than
    steps (docs/benchmarks.md), and a slow stretch of the host then falls on every variant of a round. Even rounds
    run the plans in the opposite order: the first launch of a fresh machine pays its empty compile caches
    (2026-11-28: 159-187 s to the first step against 73-81 s for the next compiled plan), and a plan that always
    ran first or last would carry the host's drift through the call alone."""
    return [(r, p) for r in range(1, rounds + 1) for p in (plans if r % 2 else plans[::-1])]


def device_name() -> str | None:
    import shutil

    if shutil.which("nvidia-smi") is None:
        return None
    return subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True).stdout.strip() or None


def build_models(models: list[str], budget_s: float | None = None) -> dict[str, float]:
    """Build each random-weight model directory before the launches, each in a child process (the bench itself
    imports no torch): its first launch would otherwise spend its time limit writing weights (7B on a fresh
    machine: the tuned plan, launched first, did not reach a step in 240 s, 2026-11-28). Idempotent: a
    directory already built is found. Seconds per model; `budget_s`: the call's time left for all of them."""
    took: dict[str, float] = {}
    began = time.perf_counter()
    for model in models:
        started = time.perf_counter()
        code = f"from engine.models.loading import resolve_model_path; print(resolve_model_path({model!r}))"
        left = None if budget_s is None else max(1.0, budget_s - (started - began))
        try:
            done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=left)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"bench/tune.py: building {model} took the call's {budget_s:.0f} s left") from None
        took[model] = round(time.perf_counter() - started, 1)
        if done.returncode:
            raise SystemExit(f"bench/tune.py: building {model} failed:\n{done.stderr[-2000:]}")
        print(f"model {model}: {done.stdout.strip()} ({took[model]} s)", flush=True)
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    parser.add_argument("--configs", default=None, help=f"comma-separated, of: {', '.join(CONFIGS)} (default: all; "
                                                        "--device cpu: tiny_cpu)")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"of {', '.join(ALL_VARIANTS)}")
    parser.add_argument("--steps", type=int, default=None, help="steps a launch (default 4 on cuda, 2 on cpu)")
    parser.add_argument("--gpu-memory", type=float, default=None,
                        help="GiB of one GPU for rlconf tune (default: nvidia-smi's; on cpu 24, the quickstart's)")
    parser.add_argument("--budget-s", type=float, default=None, help="the whole call's seconds: start no run that "
                                                                     "cannot get --min-run-s within them")
    parser.add_argument("--min-run-s", type=float, default=90.0, help="start a run only with this many seconds left")
    parser.add_argument("--run-timeout-s", type=float, default=300.0)
    parser.add_argument("--rounds", type=int, default=1, help="launch every plan this many times, round by round "
                        "(even rounds in the opposite order); the table takes the median over the rounds")
    parser.add_argument("--dry-run", action="store_true", help="build and check the plans, print the launches")
    parser.add_argument("--out", default=None, help="where files go (default: $OUT, else a temp dir)")
    parser.add_argument("--common", default=None, help="comma-separated overrides for every launch, instead of "
                                                        f"COMMON ({','.join(COMMON)})")
    args = parser.parse_args(argv)
    began = time.perf_counter()
    table_of = CPU_CONFIGS if args.device == "cpu" else CONFIGS
    names = args.configs.split(",") if args.configs else list(table_of)
    unknown = [n for n in names if n not in table_of]
    if unknown:
        parser.error(f"unknown config(s) {', '.join(unknown)} for --device {args.device}: use {', '.join(table_of)}")
    variants = tuple(args.variants.split(","))
    if set(variants) - set(ALL_VARIANTS):
        parser.error(f"unknown variant(s) {', '.join(sorted(set(variants) - set(ALL_VARIANTS)))}: use "
                     f"{', '.join(ALL_VARIANTS)}")
    steps = args.steps or (2 if args.device == "cpu" else 4)
    common = COMMON if args.common is None else [kv for kv in args.common.split(",") if kv]
    gpu_memory = args.gpu_memory
    if gpu_memory is None:
        if args.device == "cpu":
            gpu_memory = 24.0
        else:
            from rlconf.device import local_gpu

            gpu = local_gpu()
            if gpu is None:
                parser.error("no GPU found by nvidia-smi: pass --gpu-memory (e.g. 79.6 for an H100) to tune for one")
            gpu_memory = round(gpu.memory_gib, 1)
    out = out_dir(args.out, "bench_tune_out_")
    (out / "runs").mkdir(parents=True, exist_ok=True)
    report: dict = {"command": " ".join(["bench/tune.py", *(argv if argv is not None else sys.argv[1:])]),
                    "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "device": device_name() or args.device,
                    "gpu_memory_gib": gpu_memory, "steps": steps, "common": common, "runs": []}
    plans = []
    for name in names:
        plans += build_plans(name, table_of[name], gpu_memory, out, variants, common)
    for plan in plans:
        state = "ok" if plan.ok else f"NOT LAUNCHABLE: {plan.problem}"
        print(f"{plan.config:<10} {plan.variant:<8} {state}; estimate {plan.estimate_gib} GiB; {plan.source}",
              flush=True)
        print(f"    python -m rlconf launch {plan.path} {' '.join(common)} trainer.total_training_steps={steps}",
              flush=True)
    if args.dry_run:
        print(f"dry run: {len(plans)} plans under {out / 'plans'}, "
              f"{sum(p.ok for p in plans)} launchable; nothing launched")
        return 0 if all(p.ok for p in plans) else 1
    write_report(out, report)  # a build that fails or is killed still leaves the call's record
    left = None if args.budget_s is None else args.budget_s - (time.perf_counter() - began)
    report["model_builds_s"] = build_models(sorted({table_of[p.config].model for p in plans if p.ok}), left)
    for round_, plan in launch_order(plans, args.rounds):
        config = table_of[plan.config]
        run: dict = {"config": plan.config, "variant": plan.variant, "model": config.model, "gpus": config.gpus,
                     "plan": str(plan.path.relative_to(out)), "source": plan.source, "knobs": plan.knobs,
                     "round": round_}
        stem = f"{plan.config}__{plan.variant}" + (f"__r{round_}" if args.rounds > 1 else "")
        left = None if args.budget_s is None else args.budget_s - (time.perf_counter() - began)
        if not plan.ok:
            run["skipped"] = f"plan not launchable: {plan.problem}"
        elif left is not None and left < args.min_run_s:
            run["skipped"] = f"budget: {max(left, 0):.0f} s left of {args.budget_s:.0f} s"
        else:
            timeout = args.run_timeout_s if left is None else min(args.run_timeout_s, left)
            print(f"--- {plan.config} {plan.variant}{f' (round {round_})' if args.rounds > 1 else ''}: "
                  f"launching (limit {timeout:.0f} s)", flush=True)
            run.update(launch(plan, steps, timeout, out / "runs" / f"{stem}.log", common))
        finish(run, plan, config)
        (out / "runs" / f"{stem}.json").write_text(json.dumps(run, indent=2) + "\n")
        report["runs"].append(run)
        write_report(out, report)  # after every run: a killed call keeps what finished
        print(f"    {json.dumps({k: run.get(k) for k in ('steady_step_s', 'completion_tokens_per_s', 'startup_total_s', 'actor_peak_gb', 'rollout_peak_gb', 'oom', 'exit', 'skipped')})}",
              flush=True)
    report["wall_s"] = round(time.perf_counter() - began, 1)
    write_report(out, report)
    print(f"\nwrote {out / 'tune.json'} and {out / 'tune.md'}\n")
    print((out / "tune.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
