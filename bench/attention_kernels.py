"""Causal varlen attention with GQA on packed rows: which kernel, forward and backward, on one GPU.

    python bench/attention_kernels.py [--shape 1.5b] [--tokens 15088] [--backends torch_flash,cudnn,fa4]

The packed attention (engine.workers.sequence.packing) runs once per layer and micro batch. This times that call
alone for each backend on the same rows: `--rows` packed rows of `--tokens` positions (the next ones 331 fewer each), cut
into sequences of bench/train_knobs.py's length spread (each row different, as the micro batches of
an update are), q [T, heads, head dim] and k/v [T, kv heads, head dim] in bf16, causal within each
sequence, with the key/value heads as they are.

Backends:
- `torch_flash`: what the engine calls now (engine.workers.sequence.packing.flash_varlen_call: torch's flash
  operator, FlashAttention-2's kernels built into torch);
- `cudnn`: torch's cuDNN attention operator on the same cumulative lengths (aten._cudnn_attention_forward
  / _backward, ragged q/k/v);
- `fa4`: flash-attn-4's CuTe kernels (`flash_attn.cute.flash_attn_varlen_func`), where installed.

Per backend: the first call's seconds (kernel builds), milliseconds per forward and per forward +
backward on each row (median of `--iters`, CUDA events; the rows taken in turn, so a backend that
rebuilds per length pays it), TFLOP/s counting the causal pairs (forward 4 x head dim x pairs x
heads, backward twice that), and the largest difference of its output and q/k/v gradients from
torch_flash's, relative to the largest |value|. With $OUT set: $OUT/attention_kernels.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import traceback
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import layer_kernels  # noqa: E402  (the length spread)
import train_knobs  # noqa: E402  (the shapes)


def cudnn_varlen(q: Any, k: Any, v: Any, cu_seqlens: Any, max_seqlen: int, scale: float) -> Any:
    import torch

    class CudnnVarlen(torch.autograd.Function):
        @staticmethod
        def forward(ctx, q, k, v):
            out, lse, _, _, _, _, seed, offset, _ = torch.ops.aten._cudnn_attention_forward(
                q, k, v, None, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, True, 0.0, True, False,
                scale=scale)
            ctx.save_for_backward(q, k, v, out, lse, seed, offset)
            return out

        @staticmethod
        def backward(ctx, grad_out):
            q, k, v, out, lse, seed, offset = ctx.saved_tensors
            return torch.ops.aten._cudnn_attention_backward(
                grad_out.contiguous(), q, k, v, out, lse, seed, offset, None,  # None: no bias
                cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, 0.0, True, scale=scale)

    return CudnnVarlen.apply(q, k, v)


def backend_call(name: str):
    """(q, k, v, cu_seqlens, max_seqlen, scale) -> out [T, heads, head dim] for backend `name`."""
    if name == "torch_flash":
        from engine.workers.sequence.packing import flash_varlen_call

        return flash_varlen_call
    if name == "cudnn":
        return cudnn_varlen
    if name == "fa4":
        from flash_attn.cute import flash_attn_varlen_func

        def fa4(q, k, v, cu_seqlens, max_seqlen, scale):
            out = flash_attn_varlen_func(q, k, v, cu_seqlens_q=cu_seqlens, cu_seqlens_k=cu_seqlens,
                                         max_seqlen_q=max_seqlen, max_seqlen_k=max_seqlen,
                                         softmax_scale=scale, causal=True)
            return out[0] if isinstance(out, tuple) else out

        return fa4
    raise ValueError(f"unknown backend {name!r}")


def make_rows(args: argparse.Namespace, device: Any) -> list[dict[str, Any]]:
    import torch

    shape = train_knobs.SHAPES[args.shape]
    heads, kv_heads = shape["num_attention_heads"], shape["num_key_value_heads"]
    head_dim = shape["hidden_size"] // heads
    rows = []
    for seed in range(args.rows):
        # Each row a little shorter than the one before: a backend that builds per length pays it.
        lengths = layer_kernels.sequence_lengths(args.tokens - 331 * seed, args, seed=seed)
        g = torch.Generator().manual_seed(seed)
        tokens = sum(lengths)
        q, k, v = (torch.randn(tokens, h, head_dim, generator=g).to(device, torch.bfloat16)
                   for h in (heads, kv_heads, kv_heads))
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device=device)
        rows.append({"q": q, "k": k, "v": v, "cu": cu, "max": max(lengths), "lengths": lengths,
                     "grad": torch.randn(tokens, heads, head_dim, generator=g).to(device, torch.bfloat16),
                     "pairs": sum(n * (n + 1) // 2 for n in lengths), "heads": heads, "head_dim": head_dim})
    return rows


def run_once(call, row: dict[str, Any], backward: bool) -> tuple[Any, ...]:
    q, k, v = (row[name].detach().requires_grad_(backward) for name in ("q", "k", "v"))
    out = call(q, k, v, row["cu"], row["max"], row["head_dim"] ** -0.5)
    if not backward:
        return (out,)
    out.backward(row["grad"])
    return out, q.grad, k.grad, v.grad


def time_backend(name: str, rows: list[dict[str, Any]], iters: int, reference: list[tuple] | None) -> dict[str, Any]:
    import torch

    call = backend_call(name)
    start = time.perf_counter()
    first = [run_once(call, row, backward=True) for row in rows]
    torch.cuda.synchronize()
    result: dict[str, Any] = {"first_call_s": time.perf_counter() - start}
    if reference is not None:
        result["rel_diff"] = {
            part: max(float((mine[i].float() - ref[i].float()).abs().max() / ref[i].float().abs().max())
                      for mine, ref in zip(first, reference, strict=True))
            for i, part in enumerate(("out", "dq", "dk", "dv"))}
    for backward in (False, True):
        per_row: list[list[float]] = [[] for _ in rows]
        for _ in range(iters):
            for index, row in enumerate(rows):  # rows in turn: a per-length rebuild would show here
                begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                begin.record()
                run_once(call, row, backward)
                end.record()
                end.synchronize()
                per_row[index].append(begin.elapsed_time(end))
        key = "fwd_bwd" if backward else "fwd"
        ms = [statistics.median(times) for times in per_row]
        flops = [4 * row["head_dim"] * row["pairs"] * row["heads"] * (3 if backward else 1) for row in rows]
        result[f"{key}_ms"] = ms
        result[f"{key}_tflops"] = [f / (t * 1e-3) / 1e12 for f, t in zip(flops, ms, strict=True)]
    return result, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--shape", default="1.5b", choices=[s for s in train_knobs.SHAPES if s != "tiny"])
    parser.add_argument("--tokens", type=int, default=15088)
    parser.add_argument("--rows", type=int, default=3)
    parser.add_argument("--iters", type=int, default=10)
    parser.add_argument("--backends", default="torch_flash,cudnn,fa4")
    parser.add_argument("--prompt-min", type=int, default=16)
    parser.add_argument("--prompt-max", type=int, default=256)
    parser.add_argument("--response-min", type=int, default=32)
    parser.add_argument("--response-max", type=int, default=1024)
    args = parser.parse_args()

    import torch

    if not torch.cuda.is_available():
        sys.exit("attention_kernels: needs a CUDA GPU (every backend here is a CUDA kernel)")
    device = torch.device("cuda")
    rows = make_rows(args, device)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}; "
          f"rows of {[sum(r['lengths']) for r in rows]} tokens, {[len(r['lengths']) for r in rows]} sequences")
    results: dict[str, Any] = {}
    reference = None
    for name in args.backends.split(","):
        try:
            results[name], outputs = time_backend(name, rows, args.iters, reference)
            if name == "torch_flash":
                reference = outputs
        except Exception as error:  # one backend failing (not installed, unsupported) keeps the others
            traceback.print_exc()
            results[name] = {"error": f"{type(error).__name__}: {error}"[:500]}
        print(name, json.dumps(results[name], default=lambda x: round(x, 4)))
    print(f"\n{'backend':12s} {'first s':>8s} {'fwd ms':>16s} {'fwd+bwd ms':>20s} {'TFLOP/s fwd+bwd':>18s}  max rel diff")
    for name, row in results.items():
        if "error" in row:
            print(f"{name:12s} error: {row['error']}")
            continue
        fmt = lambda values, spec: "/".join(format(v, spec) for v in values)  # noqa: E731
        print(f"{name:12s} {row['first_call_s']:8.2f} {fmt(row['fwd_ms'], '.2f'):>16s} {fmt(row['fwd_bwd_ms'], '.2f'):>20s} "
              f"{fmt(row['fwd_bwd_tflops'], '.0f'):>18s}  {row.get('rel_diff', '')}")
    if os.environ.get("OUT"):
        Path(os.environ["OUT"], "attention_kernels.json").write_text(json.dumps(
            {"args": vars(args), "device": torch.cuda.get_device_name(), "torch": torch.__version__,
             "results": results}, indent=1))


if __name__ == "__main__":
    main()
