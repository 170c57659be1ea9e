"""PPO with and without a reward model on the lent GPUs: verl's run_qwen2-7b_rm_seq_balance.sh at a small shape.

    python bench/reward_model.py [--configs no_rm,served_colocated,served_pool,fsdp_rm] [--steps 8]
                                 [--run-timeout-s 280] [--budget-s 560] [--dry-run]

The workload keeps the example's settings (GAE with a critic, packing, gradient checkpointing, dynamic batch
size with its token budgets: actor and log-probs 24,000, critic 98,304; rollout by vLLM at tensor parallel 1
and gpu_memory_utilization 0.5; the reward model served by vLLM in verl's reward loop, tensor parallel 1)
and shrinks the rest: a random-weight Qwen2.5-0.5B policy and critic (its tokenizer filled with placeholder
tokens up to its 151,936 ids, so the decoded responses are 512 tokens of text), the synthetic task's prompts (at most
64 tokens), 512 sampled tokens a response (`ignore_eos`), 128 prompts a step in mini batches of 32, n 1.
The reward model is `engine.models.tiny.build_tiny_reward_model` at Qwen2.5-0.5B's layer shape (896 wide,
24 layers, 14 heads, 2 key/value heads, MLP 4,864; the policy's tokenizer and vocabulary): its weights are set by hand so
its score is the fraction of digit tokens, so it scores like a trained one and costs what a 0.5B
scorer costs. Configurations (each one `rlconf launch presets/ppo_reward_model.yaml ...` in a fresh process):

- no_rm: the same plan with the reward model off (the synthetic task's rule reward), one GPU;
- served_colocated: verl's reward loop on the actor's GPU, asleep except while it scores (the example's
  layout; its gpu_memory_utilization is 0.8 there and RM_COLOCATED_UTILIZATION here: beside a 0.5B
  actor's and critic's states and three CUDA contexts, vLLM must find its share free when it wakes);
- served_pool: verl's reward loop on a pool of its own (reward_model.enable_resource_pool, one more GPU),
  never asleep, gpu_memory_utilization 0.8 as in the example;
- fsdp_rm: the FSDP reward-model worker (use_reward_loop false), dynamic batch size with the guide's budget
  for forward passes (forward_max_token_len_per_gpu = 2 × the actor's), one GPU.

From each run: the steady step (median `timing/step` of steps 2..N, bench/watched_launch.py steady_records), completion tokens/s, the reward stage's seconds, and the memory the
compiler estimates for the plan as launched (this GPU's size) beside the measured one, phase by phase: the GPU's
allocated memory at the phase's peak summed over the processes sharing it (measured_phases: a role's
`memory/*_peak_gb` plus the other roles' `memory/*_resident_gb`), and the device's used memory polled by
nvidia-smi every 200 ms (its peak, GPU by GPU: CUDA contexts and the caching allocators' free reserve included).
Writes reward_model.json and reward_model.md under --out (else $OUT), rewritten after every run.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from watched_launch import steady_records, watched_launch  # noqa: E402

PROMPTS, MINI, RESPONSE_TOKENS, PROMPT_TOKENS = 128, 32, 512, 64
ACTOR_TOKENS, CRITIC_TOKENS = 24_000, 98_304  # the example's ppo_max_token_len_per_gpu for actor and critic
RM_COLOCATED_UTILIZATION, RM_POOL_UTILIZATION = 0.5, 0.8
REWARD_SHAPE = dict(hidden_size=896, num_layers=24, num_heads=14, num_kv_heads=2, intermediate_size=4864,
                    max_position_embeddings=4096)
CONFIGS = ("no_rm", "served_colocated", "served_pool", "fsdp_rm")
GPUS = {"no_rm": 1, "served_colocated": 1, "served_pool": 2, "fsdp_rm": 1}


def workload(policy: str, steps: int) -> list[str]:
    """The example's settings at the small shape (every configuration)."""
    arr = "actor_rollout_ref"
    return [
        "trainer.device=cuda", "trainer.n_gpus_per_node=1", f"{arr}.model.path={policy}", f"critic.model.path={policy}",
        f"{arr}.model.dtype=bfloat16", f"{arr}.rollout.dtype=bfloat16",
        f"{arr}.model.use_remove_padding=true", "critic.model.use_remove_padding=true",
        f"{arr}.model.enable_gradient_checkpointing=true", "critic.model.enable_gradient_checkpointing=true",
        f"data.train_batch_size={PROMPTS}", f"{arr}.actor.ppo_mini_batch_size={MINI}", "critic.ppo_mini_batch_size=null",
        f"{arr}.actor.use_dynamic_bsz=true", f"{arr}.actor.ppo_max_token_len_per_gpu={ACTOR_TOKENS}",
        f"{arr}.rollout.log_prob_use_dynamic_bsz=true", f"{arr}.rollout.log_prob_max_token_len_per_gpu={ACTOR_TOKENS}",
        "critic.use_dynamic_bsz=true", f"critic.ppo_max_token_len_per_gpu={CRITIC_TOKENS}",
        f"critic.forward_max_token_len_per_gpu={CRITIC_TOKENS}",
        f"{arr}.actor.ppo_micro_batch_size_per_gpu=null", "critic.ppo_micro_batch_size_per_gpu=null",
        "critic.forward_micro_batch_size_per_gpu=null", f"{arr}.rollout.log_prob_micro_batch_size_per_gpu=null",
        f"{arr}.actor.use_kl_loss=false", "algorithm.use_kl_in_reward=false", f"{arr}.actor.optim.lr=1e-6",
        "critic.optim.lr=1e-5", f"{arr}.rollout.name=vllm", f"{arr}.rollout.tensor_model_parallel_size=1",
        f"{arr}.rollout.gpu_memory_utilization=0.5", f"{arr}.rollout.enforce_eager=false",
        f"{arr}.rollout.ignore_eos=true", f"data.max_prompt_length={PROMPT_TOKENS}",
        f"data.max_response_length={RESPONSE_TOKENS}", f"trainer.total_training_steps={steps}", "trainer.save_freq=-1",
        "trainer.test_freq=-1", "trainer.critic_warmup=0",
    ]


def config_overrides(name: str, reward_dir: str) -> list[str]:
    """What each configuration adds to the workload."""
    if name == "no_rm":
        return ["reward_model.enable=false"]
    rm = [f"reward_model.model.path={reward_dir}", "reward_model.micro_batch_size_per_gpu=null"]
    served = [*rm, "reward_model.use_reward_loop=true", "reward_model.rollout.name=vllm",
              "reward_model.rollout.tensor_model_parallel_size=1", "reward_model.rollout.dtype=bfloat16",
              f"reward_model.rollout.max_model_len={PROMPT_TOKENS * 4 + RESPONSE_TOKENS}"]
    if name == "served_colocated":
        return [*served, f"reward_model.rollout.gpu_memory_utilization={RM_COLOCATED_UTILIZATION}"]
    if name == "served_pool":
        return [*served, f"reward_model.rollout.gpu_memory_utilization={RM_POOL_UTILIZATION}",
                "reward_model.enable_resource_pool=true", "reward_model.nnodes=1", "reward_model.n_gpus_per_node=1"]
    if name == "fsdp_rm":
        # The policy's tokenizer is the scorer's: the worker reads the policy's ids as they are (no input_tokenizer).
        return [*rm, "reward_model.use_reward_loop=false", "reward_model.use_dynamic_bsz=true",
                f"reward_model.forward_max_token_len_per_gpu={2 * ACTOR_TOKENS}"]
    raise ValueError(f"unknown configuration {name!r}; known: {', '.join(CONFIGS)}")


def plan_estimate(overrides: list[str]) -> dict[str, float]:
    """The compiler's memory estimate of the plan as launched, GiB per GPU by '<pool>/<phase>'; errors stop."""
    from rlconf.compile import compile_plan

    result = compile_plan(ROOT / "presets" / "ppo_reward_model.yaml", overrides)
    if result.resolved is None:
        raise SystemExit("\n".join(d.message for d in result.diagnostics))
    return {f"{phase.pool}/{phase.phase}": round(phase.total_gib, 2) for phase in result.resolved.memory}


class DevicePoll:
    """nvidia-smi's used memory of every GPU every 200 ms in a process of its own; the peak per GPU, MiB."""

    def __init__(self, path: Path):
        self.path = path
        self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
                                      "-lms", "200"], stdout=open(path, "w"), stderr=subprocess.DEVNULL)

    def stop(self) -> dict[str, float]:
        self.proc.terminate()
        self.proc.wait()
        peaks: dict[str, float] = {}
        for line in self.path.read_text().splitlines():
            try:
                index, used = (part.strip() for part in line.split(","))
                peaks[index] = max(peaks.get(index, 0.0), float(used))
            except ValueError:
                continue
        return {gpu: round(mib / 1024, 2) for gpu, mib in sorted(peaks.items())}


def measure(records: list[dict]) -> dict:
    """Steady step, throughput, reward-stage seconds and the measured memory from metrics.jsonl lines."""
    warm = steady_records(records)
    steady = statistics.median(r["timing/step"] for r in warm)
    length = statistics.median(r["response_length/mean"] for r in warm)
    out = {"steps": len(records), "step_s": [round(r["timing/step"], 2) for r in records],
           "steady_step_s": round(steady, 3), "completion_tokens_per_s": round(PROMPTS * length / steady, 1),
           "steady_steps": [r["step"] for r in warm],
           "reward_mean": [round(r["reward/mean"], 4) for r in records],
           "startup_total_s": records[0].get("timing/startup_total")}
    stages = sorted({k for r in warm for k in r if k.startswith("timing/") and not k.startswith("timing/startup")})
    out["stage_medians_s"] = {k[len("timing/"):]: round(statistics.median(r[k] for r in warm if k in r), 3)
                              for k in stages}
    for key in ("memory/actor_peak_gb", "memory/critic_peak_gb", "memory/rollout_peak_gb", "memory/actor_resident_gb",
                "memory/critic_resident_gb", "memory/rollout_device_used_gb", "memory/reward_model_peak_gb",
                "memory/reward_model_device_used_gb"):
        values = [r[key] for r in records if key in r]
        if values:
            out[key.split("/")[1]] = round(max(values), 2)
    return out


def measured_phases(run: dict) -> dict[str, float]:
    """The GPU's allocated memory at each phase's peak, summed over the processes sharing it, by '<pool>/<phase>':
    the process at its peak (its `memory/*_peak_gb`) plus what each other role's process keeps meanwhile (its
    `memory/*_resident_gb`, measured after its update). The FSDP reward model's own process is not measured:
    where it shares the GPU, no phase of that GPU is reported."""
    critic = run.get("critic_resident_gb", 0.0)  # 0 without a critic
    out = {}
    if run.get("config") == "fsdp_rm":
        return out
    if "actor_peak_gb" in run:
        out["global/training"] = run["actor_peak_gb"] + critic
    if "rollout_peak_gb" in run:  # the actor's process holds its states and vLLM's pool then
        out["global/rollout"] = run["rollout_peak_gb"] + critic
    if "reward_model_peak_gb" in run:
        if run.get("config") == "served_pool":
            out["reward_pool/reward"] = run["reward_model_peak_gb"]
        elif "actor_resident_gb" in run:
            out["global/reward"] = run["reward_model_peak_gb"] + run["actor_resident_gb"] + critic
    return out


def compare(run: dict, estimate: dict[str, float]) -> dict[str, float]:
    """Estimate ÷ measured for every phase measured (measured_phases), and the largest phase against the device's
    peak (nvidia-smi: the CUDA contexts and the caching allocators' free reserve included, so it reads higher)."""
    measured = run["measured_gib"] = {k: round(v, 2) for k, v in measured_phases(run).items()}
    out = {phase: round(estimate[phase] / gib, 3) for phase, gib in measured.items() if phase in estimate and gib}
    if run.get("device_peak_gib"):
        out["peak_phase_vs_device_peak"] = round(
            max(v for k, v in estimate.items() if k.startswith("global/")) / run["device_peak_gib"]["0"], 3)
    return out


def run_config(name: str, policy: str, reward_dir: str, steps: int, timeout_s: float, out: Path) -> dict:
    overrides = workload(policy, steps) + config_overrides(name, reward_dir)
    gib = float(subprocess.run(["nvidia-smi", "--query-gpu=memory.total", "--format=csv,noheader,nounits", "-i", "0"],
                               capture_output=True, text=True).stdout.split()[0]) / 1024
    overrides.append(f"estimate.gpu_memory_gib={gib:.1f}")
    result: dict = {"config": name, "gpus": GPUS[name], "overrides": overrides, "estimate_gib": plan_estimate(overrides)}
    with tempfile.TemporaryDirectory(prefix="bench_rm_") as tmp:
        run_dir = Path(tmp) / "run"
        command = [sys.executable, "-m", "rlconf", "launch", str(ROOT / "presets" / "ppo_reward_model.yaml"),
                   *overrides, "--run-dir", str(run_dir)]
        poll = DevicePoll(Path(tmp) / "smi.csv")
        run = watched_launch(command, run_dir, steps, timeout_s, out / f"reward_model_{name}.log", ROOT)
        result["device_peak_gib"] = poll.stop()
    result.update(exit=run.exit, wall_s=run.wall_s, timed_out=run.timed_out)
    if len(run.records) < 2:
        result["error"] = (run.traceback or (out / f"reward_model_{name}.log").read_text(errors="replace"))[-3000:]
    if run.records:
        result.update(measure(run.records))
        result["estimate_over_measured"] = compare(result, result["estimate_gib"])
    return result


def table(results: list[dict]) -> str:
    lines = ["| configuration | GPUs | steady step s (steps) | completion tok/s | reward stage s | estimate ÷ measured "
             "by phase | device peak GiB | startup s |", "|---|---:|---:|---:|---:|---|---|---:|"]
    for r in results:
        if "steady_step_s" not in r:
            lines.append(f"| {r['config']} | {r['gpus']} | failed: {r.get('error', '')[-120:]!r} | | | | | |")
            continue
        ratio = r["estimate_over_measured"]
        steps = f"{r['steady_steps'][0]}–{r['steady_steps'][-1]}"
        lines.append(f"| {r['config']} | {r['gpus']} | {r['steady_step_s']:.2f} ({steps}) | "
                     f"{r['completion_tokens_per_s']:.0f} | {r['stage_medians_s'].get('reward', float('nan')):.2f} | "
                     f"{', '.join(f'{k} {v}' for k, v in ratio.items()) or '—'} | "
                     f"{', '.join(f'{k}: {v}' for k, v in r['device_peak_gib'].items())} | {_seconds(r.get('startup_total_s'))} |")
    return "\n".join(lines)


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.1f}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--configs", default=",".join(CONFIGS))
    parser.add_argument("--policy", default="Qwen2.5-0.5B", help="a random:// shape (rlconf.modelinfo.RANDOM_TWINS)")
    parser.add_argument("--steps", type=int, default=6, help="steps a run (steady: 2..N, bench/watched_launch.py "
                        "steady_records)")
    parser.add_argument("--run-timeout-s", type=float, default=280.0)
    parser.add_argument("--budget-s", type=float, default=560.0, help="start no run with less than 90 s left")
    parser.add_argument("--dry-run", action="store_true", help="compile every configuration's plan and stop")
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT") or "."))
    args = parser.parse_args(argv)
    names = args.configs.split(",")
    for name in names:
        config_overrides(name, "")  # an unknown name fails before anything starts
    from engine.models.tiny import build_random_model, build_tiny_reward_model, build_tokenizer
    from rlconf.modelinfo import RANDOM_PREFIX, random_shape

    # The policy's tokenizer covers its whole vocabulary (placeholder tokens): every id the random policy samples
    # is text, so the reward model reads full-length responses, as it would a real policy's.
    cache = Path(tempfile.gettempdir())
    policy = str(build_random_model(args.policy, cache / f"bench_rm_policy_{args.policy}", full_vocabulary=True))
    vocab = random_shape(RANDOM_PREFIX + args.policy)["vocab_size"]
    reward_dir = str(build_tiny_reward_model(cache / f"bench_rm_reward_{args.policy}", tokenizer=build_tokenizer(vocab),
                                             **REWARD_SHAPE))
    if args.dry_run:
        for name in names:
            estimate = plan_estimate(workload(policy, args.steps) + config_overrides(name, reward_dir)
                                     + ["estimate.gpu_memory_gib=79.6"])
            print(name, json.dumps(estimate))
        return 0
    started, results = time.perf_counter(), []
    args.out.mkdir(parents=True, exist_ok=True)
    for name in names:
        left = args.budget_s - (time.perf_counter() - started)
        if left < 90:
            results.append({"config": name, "gpus": GPUS[name], "error": f"not started: {left:.0f} s of budget left"})
            continue
        results.append(run_config(name, policy, reward_dir, args.steps, min(args.run_timeout_s, left), args.out))
        print(name, json.dumps({k: v for k, v in results[-1].items() if k != "overrides"}), flush=True)
        (args.out / "reward_model.json").write_text(json.dumps(results, indent=1))
        (args.out / "reward_model.md").write_text(table(results) + "\n")
    print(table(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
