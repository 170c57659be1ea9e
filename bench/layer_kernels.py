"""One decoder layer's forward and backward on a packed row, kernel by kernel, on one GPU.

    python bench/layer_kernels.py [--shape 1.5b] [--tokens 15088] [--variants compiled,compiled+static,...]

Where bench/profile_update.py shows a whole update, this isolates what repeats 28 times in it: one
random-weight Qwen2 decoder layer of the shape (bf16 weights, as FSDP's mixed precision computes),
a packed row of `--tokens` positions cut into sequences of bench/train_knobs.py's lengths, the
row's rotary embedding computed once outside, and `layer(x).backward(g)` with weight gradients.

Variants (joined with '+'):
- `eager` or `compiled`: the layer as is, or its forward through torch.compile as model.compile_layers
  does it (engine.models.compile.compile_decoder_layers: the row's sizes symbolic, the model's not);
- `static`: compile with `dynamic=False` instead (one graph per length: what symbolic sizes cost);
- `small_first`: the layer's first call is on a 1,024-token row (where inductor autotunes its kernels),
  the timed ones on `--tokens`;
- `varlen`: attention by torch's public varlen_attn (never flash-attn-4) with the key/value heads
  repeated to the query heads first (what the engine did before it called the flash operator with its native GQA,
  engine.workers.sequence.packing.flash_varlen_call; torch 2.11's varlen_attn has no `enable_gqa`).

No FSDP here: what FSDP2 changes in the compiled graph does not show (under `dynamic=True` it made
the head dim symbolic, which slowed the rotary kernels ~8x in the update but not here; see
engine/models/compile.py). bench/profile_update.py profiles the layers as the engine runs them.

Per variant: milliseconds per forward + backward (median of `--iters` after a warm-up, CUDA events),
then one iteration under the profiler: each kernel's total GPU time and calls. With $OUT set, the
results go to $OUT/layer_kernels.json, and for compiled variants the Triton source of the
`--sources` slowest inductor kernels to $OUT/kernels_<variant>.py (inductor's cache is pointed at a
temporary folder per variant to find them).
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import train_knobs  # noqa: E402  (the shapes and the length spread)


def sequence_lengths(tokens: int, args: argparse.Namespace, seed: int = 0) -> list[int]:
    """Lengths of train_knobs' spread (prompt + response, uniform) until `tokens` positions are filled."""
    rng = random.Random(seed)
    lengths: list[int] = []
    while sum(lengths) < tokens:
        lengths.append(rng.randint(args.prompt_min, args.prompt_max) + rng.randint(args.response_min, args.response_max))
    lengths[-1] -= sum(lengths) - tokens
    return [n for n in lengths if n > 0]


def build(args: argparse.Namespace, variant: set[str], device: Any) -> tuple[Any, dict[str, Any], Any, Any]:
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    from engine.models.compile import compile_decoder_layers
    from engine.workers.sequence import packing

    shape = dict(train_knobs.SHAPES[args.shape], num_hidden_layers=1, vocab_size=256)
    config = Qwen2Config(**shape, max_position_embeddings=32768)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(device, torch.bfloat16)
    packing.use_packed_attention(model, device)
    if "varlen" in variant:
        packing.flash_varlen_call = train_knobs.repeated_heads_varlen
        packing.varlen_kernel = lambda: "torch_flash"  # else flash-attn-4, where installed, would run instead
    layer = model.model.layers[0]
    if "static" in variant:
        layer.forward = torch.compile(layer.forward, dynamic=False)
    elif "compiled" in variant:
        compile_decoder_layers([layer])
    if "small_first" in variant:  # the compiled kernels' first call (and autotuning) on a short row
        step(layer, *packed_inputs(model, 1024, args, device))
    kwargs, x, grad = packed_inputs(model, args.tokens, args, device)
    return layer, kwargs, x, grad


def packed_inputs(model: Any, tokens: int, args: argparse.Namespace, device: Any) -> tuple[dict[str, Any], Any, Any]:
    """A packed row of `tokens` positions: the layer's keyword arguments, its input, the output's gradient."""
    import torch

    lengths = sequence_lengths(tokens, args)
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
    positions = torch.cat([torch.arange(n) for n in lengths])[None].to(device)
    x = torch.randn(1, tokens, model.config.hidden_size, device=device, dtype=torch.bfloat16, requires_grad=True)
    with torch.no_grad():
        cos_sin = model.model.rotary_emb(x, positions)
    kwargs = {"position_embeddings": cos_sin, "position_ids": positions, "attention_mask": None,
              "cu_seq_lens_q": cu, "cu_seq_lens_k": cu, "max_length_q": max(lengths), "max_length_k": max(lengths)}
    return kwargs, x, torch.randn_like(x)


def step(layer: Any, kwargs: dict[str, Any], x: Any, grad: Any) -> None:
    out = layer(x, **kwargs)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(grad)
    layer.zero_grad(set_to_none=True)
    x.grad = None


def time_variant(layer: Any, kwargs: dict[str, Any], x: Any, grad: Any, iters: int) -> list[float]:
    import torch

    for _ in range(3):
        step(layer, kwargs, x, grad)
    times = []
    for _ in range(iters):
        if x.is_cuda:
            start, stop = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            step(layer, kwargs, x, grad)
            stop.record()
            stop.synchronize()
            times.append(start.elapsed_time(stop))
        else:  # the smoke test on CPU
            began = time.perf_counter()
            step(layer, kwargs, x, grad)
            times.append((time.perf_counter() - began) * 1e3)
    return times


def kernel_table(layer: Any, kwargs: dict[str, Any], x: Any, grad: Any) -> list[dict[str, Any]]:
    import torch
    from torch.profiler import ProfilerActivity, profile

    on = torch.autograd.DeviceType.CUDA if x.is_cuda else torch.autograd.DeviceType.CPU
    with profile(activities=[ProfilerActivity.CUDA if x.is_cuda else ProfilerActivity.CPU]) as prof:
        step(layer, kwargs, x, grad)
        if x.is_cuda:
            torch.cuda.synchronize()
    by_kernel: dict[str, list[float]] = {}
    for e in prof.events():
        if e.device_type == on and not getattr(e, "is_user_annotation", False):
            entry = by_kernel.setdefault(e.name, [0.0, 0])
            entry[0] += (e.time_range.end - e.time_range.start) / 1e3
            entry[1] += 1
    ranked = sorted(by_kernel.items(), key=lambda kv: -kv[1][0])
    return [{"kernel": name[:160], "ms": round(ms, 4), "calls": calls} for name, (ms, calls) in ranked]


def kernel_sources(caches: list[Path], names: list[str]) -> str:
    """The Triton source of each inductor kernel in `names`, found in the inductor caches (a variant may
    reuse a kernel an earlier variant compiled into its cache)."""
    found = []
    for name in names:
        for path in (p for cache in caches for p in cache.rglob("*.py")):
            text = path.read_text(errors="replace")
            if f"def {name}(" in text:
                start = text.index(f"def {name}(")
                head = text.rfind("@triton", 0, start)
                found.append(f"# ---- {name} ({path.name})\n{text[head if head >= 0 else start:][:6000]}")
                break
    return "\n\n".join(found)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    train_knobs.add_workload_arguments(parser)
    parser.add_argument("--tokens", type=int, default=15088, help="positions in the packed row")
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--variants", default="eager,compiled+varlen,compiled,compiled+static")
    parser.add_argument("--sources", type=int, default=4, help="Triton sources of the N slowest inductor kernels")
    args = parser.parse_args()

    import torch

    device = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    out_dir = Path(os.environ["OUT"]) if os.environ.get("OUT") else None
    info: dict[str, Any] = {"torch": torch.__version__,
                            "device": torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"}
    try:
        from torch.nn.attention.varlen import varlen_attn
        info["varlen_attn_signature"] = str(inspect.signature(varlen_attn))
    except ImportError as error:
        info["varlen_attn_signature"] = f"n/a: {error}"
    print(json.dumps(info), flush=True)
    results: dict[str, Any] = {"info": info, "args": vars(args), "variants": []}
    caches: list[Path] = []
    for name in args.variants.split(","):
        variant = set(name.split("+"))
        torch._dynamo.reset()
        caches.append(Path(tempfile.mkdtemp(prefix="inductor-")))
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(caches[-1])
        from engine.workers.sequence import packing
        saved_call, saved_kernel = packing.flash_varlen_call, packing.varlen_kernel
        try:
            layer, kwargs, x, grad = build(args, variant, device)
            times = time_variant(layer, kwargs, x, grad, args.iters)
            kernels = kernel_table(layer, kwargs, x, grad)
            row = {"variant": name, "ms_median": round(statistics.median(times), 3), "ms_all": [round(t, 3) for t in times],
                   "peak_gib": round(torch.cuda.max_memory_allocated() / 2**30, 2) if x.is_cuda else None,
                   "kernels": kernels[:30]}
            slow_triton = [k["kernel"] for k in kernels if k["kernel"].startswith("triton_")][:args.sources]
            if out_dir and slow_triton:
                (out_dir / f"kernels_{name.replace('+', '_')}.py").write_text(kernel_sources(caches, slow_triton))
        except Exception as error:  # one failing variant must not lose the others
            row = {"variant": name, "error": f"{type(error).__name__}: {str(error)[:2000]}"}
        finally:
            packing.flash_varlen_call, packing.varlen_kernel = saved_call, saved_kernel
        results["variants"].append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "kernels"}), flush=True)
        for k in row.get("kernels", [])[:14]:
            print(f"  {k['ms']:9.3f} ms {k['calls']:4d}x  {k['kernel'][:110]}", flush=True)
        if device.type == "cuda":
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
    if out_dir:
        (out_dir / "layer_kernels.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
