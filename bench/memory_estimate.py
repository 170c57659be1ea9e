"""`rlconf explain`'s memory estimate next to the peak a real run measures, on one GPU.

    python bench/memory_estimate.py [--steps 3] [--hidden-size 896 --num-layers 24 ...] [key=value ...]

Builds a random-weight Qwen2 model of the given shape (default: Qwen2.5-0.5B's layers, hidden size
and heads; the offline tokenizer's 512-token vocabulary), compiles the CPU quickstart moved to one
GPU in bf16 with prompts of up to 16 tokens and 496 sampled tokens each (ignore_eos; the engine trims
each micro batch to its longest prompt, and the synthetic prompts are 10-16 tokens, so the sequences
have about the shape the estimate assumes: 16 + 496), then trains a few GRPO steps in this process (the engine's
workers without Ray: LocalWorkerGroup) and prints, side by side, the estimate per phase and the
worker's measured peak (torch.cuda.max_memory_allocated), plus the median seconds per stage.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--hidden-size", type=int, default=896)
    parser.add_argument("--num-layers", type=int, default=24)
    parser.add_argument("--num-heads", type=int, default=14)
    parser.add_argument("--num-kv-heads", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=4864)
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides of the plan")
    args = parser.parse_args()

    import torch

    from engine.models.tiny import build_tiny_model
    from engine.trainer import build_trainer
    from engine.workers.cluster.local import LocalWorkerGroup
    from rlconf.compile import compile_plan

    if not torch.cuda.is_available():
        raise SystemExit("needs a CUDA GPU")
    gpu_gib = torch.cuda.get_device_properties(0).total_memory / 2**30
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_model(Path(tmp) / "model", arch="qwen2", hidden_size=args.hidden_size,
                                     num_layers=args.num_layers, num_heads=args.num_heads,
                                     num_kv_heads=args.num_kv_heads, intermediate_size=args.intermediate_size,
                                     max_position_embeddings=1024)
        overrides = [
            f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cuda", "trainer.n_gpus_per_node=1",
            "actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
            "data.max_prompt_length=16", "data.max_response_length=496", "actor_rollout_ref.rollout.ignore_eos=true",
            f"trainer.total_training_steps={args.steps}", "trainer.save_freq=-1", f"estimate.gpu_memory_gib={gpu_gib:.1f}",
            *args.overrides,
        ]
        result = compile_plan(ROOT / "presets" / "quickstart.yaml", overrides)
        if result.resolved is None:
            raise SystemExit("\n".join(d.message for d in result.diagnostics))
        resolved = result.resolved
        run_dir = Path(tmp) / "run"
        trainer = build_trainer(resolved, run_dir, LocalWorkerGroup, log=lambda line: None)
        started = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - started
        trainer.close()
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
        params = sum(p.numel() for p in trainer.group.worker.actor.parameters())  # one rank: the full model
        reserved = torch.cuda.max_memory_reserved() / 2**30
        trainer.group.kill()

    actor = resolved.roles.actor
    print(f"device: {torch.cuda.get_device_name(0)} ({gpu_gib:.1f} GiB), torch {torch.__version__}, "
          f"Python {platform.python_version()}")
    print(f"model: {params / 1e6:.0f}M parameters (hidden {args.hidden_size}, {args.num_layers} layers); "
          f"{resolved.roles.rollout.prompt_length}+{resolved.roles.rollout.response_length} tokens a sequence, "
          f"{actor.sequences_per_gpu} sequences a step, micro batch {actor.ppo_micro_batch_size_per_gpu}")
    print("estimate (rlconf explain), GiB per GPU:")
    for phase in resolved.memory:
        terms = ", ".join(f"{t.what} {t.gib:.2f}" for t in phase.terms)
        print(f"  {phase.phase:<9} {phase.total_gib:7.2f}   ({terms})")
    estimate = max(phase.total_gib for phase in resolved.memory)
    measured = max(m["memory/actor_peak_gb"] for m in metrics)
    print(f"measured peak allocated (memory/actor_peak_gb): {measured:.2f} GiB; reserved by the caching allocator: "
          f"{reserved:.2f} GiB")
    print(f"estimate / measured: {estimate / measured:.2f}")
    print(f"{len(metrics)} steps in {seconds:.1f} s; median seconds per step:")
    for key in sorted(k for k in metrics[0] if k.startswith("timing/")):
        print(f"  {key:<36} {statistics.median(m[key] for m in metrics):8.3f}")
    print(f"  {'perf/tokens_per_second':<36} {statistics.median(m['perf/tokens_per_second'] for m in metrics):8.0f}")


if __name__ == "__main__":
    main()
