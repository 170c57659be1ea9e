"""Where the actor update's time goes on one GPU: a torch.profiler trace of one update per variant.

    python bench/profile_update.py [--shape 0.5b|1.5b] [--variants packed+dynamic,hf_reference] [train_knobs options]

The workload and variants are bench/train_knobs.py's (same batch, same plans). After a warm-up
update, one update runs under the profiler. Reported per variant: wall seconds; the GPU's busy time
(the union of its kernel intervals: the rest of the wall is the GPU waiting for the CPU); the top
kernels by total GPU time, grouped into families (matmul, attention, the loss head's elementwise
and reductions, FSDP copies, optimizer, other); the GPU's idle gaps (their total, and the longest
with the kernels either side); the spans of the profiler's annotations on the GPU timeline (the
optimizer step's, compiled graphs': kept apart from the kernels they contain); the CPU
operators with the largest self time; with `--stacks N`, the N copy, cast and accumulation call
sites (operator and Python stack) with the most GPU time.
Writes profile_update.json under $OUT when set (and with `--trace`, each profiled update's Chrome
trace, gzipped).
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
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


def spread(values: list[float]) -> dict[str, float]:
    """Count, min, median and max of `values`."""
    ordered = sorted(values)
    return {"calls": len(ordered), "min": round(ordered[0], 1), "median": round(ordered[len(ordered) // 2], 1),
            "max": round(ordered[-1], 1)}


# Operators whose kernels are copies, casts and accumulations: `--stacks` says where they are called.
COPY_OPS = ("aten::copy_", "aten::_to_copy", "aten::clone", "aten::cat", "aten::_chunk_cat", "aten::add_",
            "aten::contiguous", "aten::index_select", "aten::index", "aten::fill_")


def call_site(event: Any, depth: int = 6) -> tuple[str, ...]:
    """The innermost `depth` callers of a profiled operator outside torch: Python frames (with_stack
    records them as the operator's ancestors) or, in the backward, the autograd node that ran it."""
    frames, caller = [], event.cpu_parent
    while caller is not None and len(frames) < depth:
        key = caller.key
        if key.startswith("autograd::engine::evaluate_function"):
            frames.append(key.removeprefix("autograd::engine::evaluate_function: "))
        elif ".py(" in key and "torch/" not in key:
            frames.append(key)
        caller = caller.cpu_parent
    return tuple(frames)


def copy_sites(prof: Any, top: int) -> list[dict[str, Any]]:
    """The `top` (operator, call site) pairs of COPY_OPS by GPU time (a trace taken with_stack=True)."""
    sites: dict[tuple[str, tuple[str, ...]], list[float]] = {}
    for event in prof.events():
        if event.key in COPY_OPS and event.self_device_time_total > 0:
            site = sites.setdefault((event.key, call_site(event)), [0.0, 0])
            site[0] += event.self_device_time_total
            site[1] += 1
    ranked = sorted(sites.items(), key=lambda item: -item[1][0])[:top]
    return [{"op": op, "ms": round(us / 1e3, 3), "calls": calls, "stack": list(frames)}
            for (op, frames), (us, calls) in ranked]


def profile_variant(worker: Any, batch: dict, device: Any, stacks: int = 0, trace: Path | None = None) -> dict[str, Any]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    worker.update_actor(batch)  # warm-up
    train_knobs.sync(device)
    # Python stacks slow the CPU side down: the wall time of a --stacks run is not the update's.
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA], with_stack=stacks > 0) as prof:
        start = time.perf_counter()
        worker.update_actor(batch)
        train_knobs.sync(device)
        wall = time.perf_counter() - start
    if trace is not None:
        raw = trace.with_suffix("")
        prof.export_chrome_trace(str(raw))
        with open(raw, "rb") as source, gzip.open(trace, "wb") as target:
            shutil.copyfileobj(source, target)
        raw.unlink()
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
    calls: dict[str, list[float]] = {}
    for e in kernels:
        us = e.time_range.end - e.time_range.start
        by_family[family(e.name)] = by_family.get(family(e.name), 0.0) + us / 1e6
        by_kernel[e.name] = by_kernel.get(e.name, 0.0) + us / 1e6
        calls.setdefault(e.name, []).append(us)
    top = sorted(by_kernel.items(), key=lambda kv: -kv[1])[:20]
    gaps = idle_gaps(sorted((e.time_range.start, e.time_range.end, e.name) for e in kernels))
    cpu_ops = sorted(((e.key, e.self_cpu_time_total / 1e6) for e in prof.key_averages()), key=lambda kv: -kv[1])[:15]
    return {"wall_s": wall, "gpu_busy_s": busy_seconds(intervals), "kernels": len(kernels),
            "families_s": dict(sorted(by_family.items(), key=lambda kv: -kv[1])),
            "top_kernels_s": dict(top),
            # per call, in µs: a kernel slow on every call differs from one slow on a few (a shared stream, a first call)
            "top_kernel_calls_us": {name[:100]: spread(calls[name]) for name, _ in top},
            "idle_gaps": gaps,
            "annotation_spans_s": dict(sorted(spans.items(), key=lambda kv: -kv[1])[:10]),
            "top_cpu_self_s": dict(cpu_ops),
            **({"copy_sites": copy_sites(prof, stacks)} if stacks else {})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    train_knobs.add_workload_arguments(parser)
    parser.add_argument("--variants", default="packed+dynamic")
    parser.add_argument("--stacks", type=int, default=0,
                        help="also list the N copy / cast / accumulate call sites with the most GPU time (slower)")
    parser.add_argument("--trace", action="store_true",
                        help="also write the profiled update's Chrome trace to $OUT/trace_<variant, + as __>.json.gz")
    args = parser.parse_args()
    args.steps = 1
    train_knobs.apply_kernel_arguments(args)

    import torch

    from engine.workers.cluster.device import join_process_group, listen_for_rendezvous, set_rendezvous_env

    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if device.type == "cuda":
        torch.cuda.set_device(0)
    set_rendezvous_env(0, 1, "127.0.0.1", listen_for_rendezvous("127.0.0.1"), "127.0.0.1")
    join_process_group(device, 0, 1)
    config, state, _ = train_knobs.random_model(args.shape)
    batch = train_knobs.make_batch(args, config.vocab_size)
    tokens = int(batch["attention_mask"].sum())
    results = []
    for name in args.variants.split(","):
        if train_knobs.VARIANTS[name][0] in ("hf", "n/a"):
            raise SystemExit(f"{name}: only the engine's variants are profiled here (train_knobs.py times {name})")
        resolved = train_knobs.compile_variant(args, train_knobs.VARIANTS[name])
        worker = train_knobs.engine_worker(resolved, train_knobs.build_model(config, state, device), device)
        # '+' is not a character the device machine sends files back with.
        safe = name.replace("+", "__")
        trace = Path(os.environ["OUT"], f"trace_{safe}.json.gz") if args.trace and os.environ.get("OUT") else None
        row = {"variant": name, "shape": args.shape, "tokens": tokens,
               **profile_variant(worker, batch, device, args.stacks, trace)}
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
