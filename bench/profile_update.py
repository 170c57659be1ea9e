"""Where the actor update's time goes on one GPU: a torch.profiler trace of one update per variant.

    python bench/profile_update.py [--shape 0.5b|1.5b] [--variants packed+dynamic,hf_reference] [train_knobs options]

The workload and variants are bench/train_knobs.py's (same batch, same plans). After a warm-up
update, one update runs under the profiler. Reported per variant: wall seconds; the GPU's busy time
(the union of its kernel intervals: the rest of the wall is the GPU waiting for the CPU); the top
kernels by total GPU time, grouped into families (matmul, attention, the loss head's elementwise
and reductions, FSDP copies, optimizer, other); the GPU's idle gaps (their total, and the longest
with the kernels either side); the spans of the profiler's annotations on the GPU timeline (the
optimizer step's, compiled graphs': kept apart from the kernels they contain); and the CPU
operators with the largest self time.
Writes profile_update.json (and nothing else) under $OUT when set.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import train_knobs  # noqa: E402  (the workload and the variants)

FAMILIES = [  # substring of a kernel name (lower case) -> family; first match wins
    ("gemm", "matmul"), ("cutlass", "matmul"), ("sm90_xmma", "matmul"), ("nvjet", "matmul"), ("cublas", "matmul"),
    ("flash", "attention"), ("fmha", "attention"), ("attention", "attention"), ("varlen", "attention"),
    ("adam", "optimizer"), ("foreach", "optimizer"),
    ("softmax", "loss head / norms"), ("logsumexp", "loss head / norms"), ("reduce", "reductions"),
    ("copy", "copies / casts"), ("cat", "copies / casts"), ("fill", "copies / casts"),
    ("elementwise", "elementwise"), ("vectorized", "elementwise"),
]


def family(name: str) -> str:
    low = name.lower()
    return next((fam for key, fam in FAMILIES if key in low), "other")


def busy_seconds(intervals: list[tuple[float, float]]) -> float:
    """Length of the union of [start, end) intervals (µs in, s out): time the GPU ran any kernel."""
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total / 1e6


def idle_gaps(kernels: list[tuple[float, float, str]], at_least_us: float = 200.0, top: int = 12) -> dict[str, Any]:
    """Where the GPU waits for the CPU: gaps of at least `at_least_us` between one kernel's end (the
    latest so far) and the next kernel's start, their total, and the longest with the kernels around
    them (a gap after a sync or a host-side loop shows which work it sits between)."""
    found, end, before = [], float("-inf"), ""
    for start, stop, name in kernels:
        if end > float("-inf") and start - end >= at_least_us:
            found.append((start - end, before[:80], name[:80]))
        if stop > end:
            end, before = stop, name
    found.sort(key=lambda gap: -gap[0])
    return {"count": len(found), "total_s": sum(gap[0] for gap in found) / 1e6,
            "longest": [{"ms": round(us / 1e3, 3), "after": after, "before": nxt} for us, after, nxt in found[:top]]}


def profile_variant(worker: Any, batch: dict, device: Any) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    worker.update_actor(batch)  # warm-up
    train_knobs.sync(device)
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        start = time.perf_counter()
        worker.update_actor(batch)
        train_knobs.sync(device)
        wall = time.perf_counter() - start
    on_gpu = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    # Annotations (`Optimizer.step#AdamW.step`, compiled graphs) span the kernels they launch: not kernels.
    annotations = [e for e in on_gpu if getattr(e, "is_user_annotation", False)]
    kernels = [e for e in on_gpu if not getattr(e, "is_user_annotation", False)]
    spans: dict[str, float] = {}
    for e in annotations:
        spans[e.name[:80]] = spans.get(e.name[:80], 0.0) + (e.time_range.end - e.time_range.start) / 1e6
    intervals = [(e.time_range.start, e.time_range.end) for e in kernels]
    by_family: dict[str, float] = {}
    by_kernel: dict[str, float] = {}
    for e in kernels:
        us = e.time_range.end - e.time_range.start
        by_family[family(e.name)] = by_family.get(family(e.name), 0.0) + us / 1e6
        by_kernel[e.name] = by_kernel.get(e.name, 0.0) + us / 1e6
    gaps = idle_gaps(sorted((e.time_range.start, e.time_range.end, e.name) for e in kernels))
    cpu_ops = sorted(((e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages()), key=lambda kv: -kv[1])[:15]
    return {"wall_s": wall, "gpu_busy_s": busy_seconds(intervals), "kernels": len(kernels),
            "families_s": dict(sorted(by_family.items(), key=lambda kv: -kv[1])),
            "top_kernels_s": dict(sorted(by_kernel.items(), key=lambda kv: -kv[1])[:20]),
            "idle_gaps": gaps,
            "annotation_spans_s": dict(sorted(spans.items(), key=lambda kv: -kv[1])[:10]),
            "top_cpu_self_s": dict(cpu_ops)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    train_knobs.add_workload_arguments(parser)
    parser.add_argument("--variants", default="packed+dynamic")
    args = parser.parse_args()
    args.steps = 1

    import torch
    import transformers
    from transformers import Qwen2Config

    from engine.workers.device import join_process_group, listen_for_rendezvous, set_rendezvous_env

    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(0)
    set_rendezvous_env(0, 1, "127.0.0.1", listen_for_rendezvous("127.0.0.1"), "127.0.0.1")
    join_process_group(device, 0, 1)
    config = Qwen2Config(**train_knobs.SHAPES[args.shape], max_position_embeddings=32768)
    torch.manual_seed(0)
    state = {k: v.clone() for k, v in transformers.AutoModelForCausalLM.from_config(config).state_dict().items()}
    batch = train_knobs.make_batch(args, config.vocab_size)
    tokens = int(batch["attention_mask"].sum())
    results = []
    for name in args.variants.split(","):
        if train_knobs.VARIANTS[name][0] in ("hf", "n/a"):
            raise SystemExit(f"{name}: only the engine's variants are profiled here (train_knobs.py times {name})")
        resolved = train_knobs.compile_variant(args, train_knobs.VARIANTS[name])
        worker = train_knobs.engine_worker(resolved, train_knobs.build_model(config, state, device), device)
        row = {"variant": name, "shape": args.shape, "tokens": tokens, **profile_variant(worker, batch, device)}
        row["tokens_per_s"] = tokens / row["wall_s"]
        results.append(row)
        print(json.dumps(row, indent=1), flush=True)
        del worker
        if device.type == "cuda":
            torch.cuda.empty_cache()
    if os.environ.get("OUT"):
        (Path(os.environ["OUT"]) / f"profile_update_{args.shape}.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
