"""GRPO step speed on one GPU, side by side in one run: rlconf (vLLM rollout), bare vLLM, TRL.

    python bench/grpo_vs_trl.py [--model random://Qwen2.5-0.5B] [--steps 6] [--parts rlconf,vllm,trl]

The same workload for each (the issue's): a random-weight model of Qwen2.5-0.5B's shape with its
real 151,936-token vocabulary, 8 prompts × 8 samples a step, 512 sampled tokens each, bf16,
gradient checkpointing, vLLM with CUDA graphs at gpu_memory_utilization 0.3, one optimizer step
a GRPO step (micro batches of 16), no reference model (KL off), prompts from the synthetic task.

- rlconf: the engine in this process (LocalWorkerGroup, one rank, vLLM in the worker), the plan
  below; `ignore_eos`, so every response is 512 tokens.
- vllm: bare `vllm.LLM.generate` of the same 64 requests (same prompts, 512 tokens each), the
  ceiling for the engine's generate stage.
- trl: TRL's GRPOTrainer with vLLM colocated (`use_vllm=True, vllm_mode="colocate"`), the same
  model directory and prompts, 64 completions an optimizer step (16 a device batch × 4 accumulation
  steps), max_completion_length 512; a random model of this vocabulary almost never samples EOS.

Each part runs in a fresh subprocess (vLLM's sleep-mode allocator serves one engine a process, and
the GPU is emptied between parts); step times are medians after the first step (warm-up: CUDA
graph capture and compilation). Completion tokens/s = sampled tokens of a step ÷ its seconds.
Prints a table last; writes results.json and each part's log under --out (else $OUT, else a temp dir).
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

from out_dir import out_dir  # noqa: E402

PROMPTS, SAMPLES, RESPONSE_TOKENS, MICRO = 8, 8, 512, 16
GPU_MEMORY_UTILIZATION = 0.3


def plan_overrides(model: str, steps: int) -> list[str]:
    """The rlconf side of the workload, as overrides of the CPU quickstart."""
    arr = "actor_rollout_ref"
    return [
        f"{arr}.model.path={model}", "trainer.device=cuda", "trainer.n_gpus_per_node=1",
        f"{arr}.model.dtype=bfloat16", f"{arr}.rollout.dtype=bfloat16", f"{arr}.model.enable_gradient_checkpointing=true",
        f"{arr}.rollout.name=vllm", f"{arr}.rollout.enforce_eager=false",
        f"{arr}.rollout.gpu_memory_utilization={GPU_MEMORY_UTILIZATION}", f"{arr}.rollout.ignore_eos=true",
        f"data.train_batch_size={PROMPTS}", f"{arr}.rollout.n={SAMPLES}", f"{arr}.actor.ppo_mini_batch_size={PROMPTS}",
        f"{arr}.actor.ppo_micro_batch_size_per_gpu={MICRO}", f"{arr}.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
        "data.max_prompt_length=16", f"data.max_response_length={RESPONSE_TOKENS}", f"trainer.total_training_steps={steps}",
        "trainer.save_freq=-1", "trainer.test_freq=-1", f"{arr}.actor.optim.lr=1e-6",
    ]


def prompt_texts(tokenizer, count: int) -> list[str]:
    """The synthetic task's first `count` prompts, as text (the same for every part)."""
    from engine.data.synthetic import make_synthetic_dataset

    rows = make_synthetic_dataset(count, 0)
    return [tokenizer.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=False) for row in rows]


def part_rlconf(model: str, steps: int, overrides: list[str]) -> dict:
    import torch

    from engine.trainer import build_trainer
    from engine.workers.cluster.local import LocalWorkerGroup
    from rlconf.compile import compile_plan

    result = compile_plan(ROOT / "presets" / "quickstart.yaml", plan_overrides(model, steps) + list(overrides)
                          + [f"estimate.gpu_memory_gib={torch.cuda.get_device_properties(0).total_memory / 2**30:.1f}"])
    if result.resolved is None:
        raise SystemExit("\n".join(d.message for d in result.diagnostics))
    resolved = result.resolved
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        trainer = build_trainer(resolved, Path(tmp), LocalWorkerGroup, log=lambda line: None)
        init_seconds = time.perf_counter() - started
        trainer.train()
        trainer.close()
        metrics = [json.loads(line) for line in (Path(tmp) / "metrics.jsonl").read_text().splitlines()]
        trainer.group.kill()
    warm = metrics[1:] or metrics
    step = statistics.median(m["timing/step"] for m in warm)
    sampled = PROMPTS * SAMPLES * RESPONSE_TOKENS
    med = {key: statistics.median(m[key] for m in warm) for key in warm[0]
           if key.startswith(("timing/", "rollout/", "memory/")) and all(key in m for m in warm)}
    estimate = {phase.phase: phase.total_gib for phase in resolved.memory}
    return {"step_s": step, "completion_tokens_per_s": sampled / step, "init_s": init_seconds,
            "response_length_mean": statistics.median(m["response_length/mean"] for m in warm),
            "generate_tokens_per_s": sampled / med["timing/generate"], "medians": med, "estimate_gib": estimate,
            "steps": len(metrics)}


def part_vllm(model: str, repeats: int = 3, logprobs: bool = False, engine_kwargs: dict | None = None) -> dict:
    import torch
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from engine.models.loading import load_tokenizer, resolve_model_path

    path = resolve_model_path(model)
    tokenizer = load_tokenizer(path)
    texts = prompt_texts(tokenizer, PROMPTS)
    requests = [TokensPrompt(prompt_token_ids=tokenizer(text)["input_ids"]) for text in texts for _ in range(SAMPLES)]
    llm = LLM(model=str(path), skip_tokenizer_init=True, dtype="bfloat16", gpu_memory_utilization=GPU_MEMORY_UTILIZATION,
              max_model_len=16 + RESPONSE_TOKENS, load_format="dummy", seed=0,
              **({"logprobs_mode": "processed_logprobs"} if logprobs else {}), **(engine_kwargs or {}))
    params = SamplingParams(temperature=1.0, max_tokens=RESPONSE_TOKENS, ignore_eos=True, detokenize=False,
                            **({"logprobs": 0, "flat_logprobs": True} if logprobs else {}))
    llm.generate(requests, params, use_tqdm=False)  # warm-up
    seconds = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        started = time.perf_counter()
        outputs = llm.generate(requests, params, use_tqdm=False)
        seconds.append(time.perf_counter() - started)
    tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
    return {"generate_s": statistics.median(seconds), "generate_tokens_per_s": tokens / statistics.median(seconds)}


def part_trl(model: str, steps: int) -> dict:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from engine.models.loading import load_tokenizer, resolve_model_path

    path = resolve_model_path(model)
    tokenizer = load_tokenizer(path)
    dataset = Dataset.from_dict({"prompt": prompt_texts(tokenizer, PROMPTS * (steps + 1))})
    step_seconds: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            self.started = time.perf_counter()

        def on_step_end(self, args, state, control, **kwargs):
            torch.cuda.synchronize()
            step_seconds.append(time.perf_counter() - self.started)

    def reward(completions, **kwargs):
        return [float(len(c) % 7) for c in completions]  # any number: the reward does not change the work

    with tempfile.TemporaryDirectory() as tmp:
        config = GRPOConfig(
            output_dir=tmp, max_steps=steps, per_device_train_batch_size=MICRO,
            gradient_accumulation_steps=PROMPTS * SAMPLES // MICRO, num_generations=SAMPLES,
            max_completion_length=RESPONSE_TOKENS, temperature=1.0, beta=0.0, learning_rate=1e-6,
            bf16=True, gradient_checkpointing=True, use_vllm=True, vllm_mode="colocate",
            vllm_gpu_memory_utilization=GPU_MEMORY_UTILIZATION, vllm_max_model_length=16 + RESPONSE_TOKENS + 64,
            logging_steps=1, report_to="none", save_strategy="no", seed=0)
        policy = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        trainer = GRPOTrainer(model=policy, reward_funcs=reward, args=config, train_dataset=dataset,
                              processing_class=tokenizer, callbacks=[Clock()])
        trainer.train()
        lengths = [log["completions/mean_length"] for log in trainer.state.log_history if "completions/mean_length" in log]
    warm = step_seconds[1:] or step_seconds
    step = statistics.median(warm)
    completion_tokens = PROMPTS * SAMPLES * (statistics.median(lengths) if lengths else RESPONSE_TOKENS)
    return {"step_s": step, "completion_tokens_per_s": completion_tokens / step, "mean_completion_length":
            statistics.median(lengths) if lengths else None, "steps": len(step_seconds),
            "peak_gib": torch.cuda.max_memory_allocated() / 2**30}


def run_part(part: str, model: str, steps: int, overrides: list[str], logs: Path) -> dict:
    """One part in a fresh Python process; its JSON result (or the error and the log's tail)."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as out:
        result_path = out.name
    cmd = [sys.executable, __file__, "--part", part, "--model", model, "--steps", str(steps), "--result", result_path,
           *overrides]
    started = time.perf_counter()
    # The part's output goes to its log as it runs, so a part cut off by a time limit still leaves it.
    log_path = logs / f"{part}.log"
    with log_path.open("w") as log:
        proc = subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    try:
        result = json.loads(Path(result_path).read_text())
    except (OSError, ValueError):
        result = {"error": f"exit {proc.returncode}", "log_tail": log_path.read_text()[-3000:]}
    result["wall_s"] = time.perf_counter() - started
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="random://Qwen2.5-0.5B")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--parts", default="rlconf,vllm,trl")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--result", help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help="where files go (default: $OUT, else a temp dir)")
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides of the rlconf plan; "
                        "actor_rollout_ref.rollout.engine_kwargs.vllm.* ones also go to the bare vLLM part")
    args = parser.parse_args()
    if args.part:
        kwargs_prefix = "actor_rollout_ref.rollout.engine_kwargs.vllm."
        engine_kwargs = {o.split("=", 1)[0][len(kwargs_prefix):]: json.loads(o.split("=", 1)[1])
                         for o in args.overrides if o.startswith(kwargs_prefix)}
        fn = {"rlconf": lambda: part_rlconf(args.model, args.steps, args.overrides),
              "vllm": lambda: part_vllm(args.model, engine_kwargs=engine_kwargs),
              "vllm_logprobs": lambda: part_vllm(args.model, logprobs=True, engine_kwargs=engine_kwargs),
              "trl": lambda: part_trl(args.model, args.steps)}[args.part]
        Path(args.result).write_text(json.dumps(fn()))
        return

    import torch

    device = torch.cuda.get_device_name(0)
    results: dict = {"device": device, "model": args.model, "date": time.strftime("%Y-%m-%d")}
    out = out_dir(args.out, "grpo_vs_trl_out_")
    for part in args.parts.split(","):
        results[part] = run_part(part, args.model, args.steps, args.overrides, out)
        print(f"{part}: {json.dumps(results[part])}", flush=True)
        # After every part: a later one cut off by a time limit loses only itself.
        (out / "results.json").write_text(json.dumps(results, indent=2))
    print(json.dumps(results, indent=2))
    print(f"\n{device}, {args.model}, {PROMPTS} prompts × {SAMPLES} samples × {RESPONSE_TOKENS} tokens")
    print(f"{'part':<8} {'step s':>8} {'completion tok/s':>17} {'generate tok/s':>15}")
    for part in ("rlconf", "vllm", "vllm_logprobs", "trl"):
        r = results.get(part, {})
        if "error" in r:
            print(f"{part:<8} failed: {r['error']}")
        elif r:
            print(f"{part:<8} {r.get('step_s', float('nan')):8.2f} {r.get('completion_tokens_per_s', float('nan')):17.0f} "
                  f"{r.get('generate_tokens_per_s', float('nan')):15.0f}")
    ours, trl, bare = results.get("rlconf", {}), results.get("trl", {}), results.get("vllm", {})
    if "completion_tokens_per_s" in ours and "completion_tokens_per_s" in trl:
        print(f"rlconf / TRL completion tokens/s: {ours['completion_tokens_per_s'] / trl['completion_tokens_per_s']:.2f}")
    if "generate_tokens_per_s" in ours and "generate_tokens_per_s" in bare:
        print(f"engine generate / bare vLLM: {ours['generate_tokens_per_s'] / bare['generate_tokens_per_s']:.2f}")


if __name__ == "__main__":
    main()
