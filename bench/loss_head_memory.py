"""GPU memory of the loss head alone (logits -> log-probs, entropy -> backward), per token × vocab.

    python bench/loss_head_memory.py [--vocab 151936] [--hidden 896] [--response-tokens 8192] [--triton | --triton-only]

The engine's own functions on a stand-in for the model's last layer: a bf16 [T, hidden] hidden state
through a bf16 [vocab, hidden] parameter (the LM head) gives [T, vocab] logits; the N response
positions are picked out (as packing's predict_index does) and `engine.workers.passes.logprob.token_log_probs`
computes the fp32 log-probs and entropy, plainly or chunked (entropy_from_logits_with_chunking),
inside `engine.workers.fsdp.offload.activation_offload` on or off, as the actor's micro step does. The
loss (log-probs and entropy means) then runs backward. Printed for each case, in bytes ÷ (N × vocab)
above what was allocated before: what the forward leaves for backward, the forward's peak and the
backward's peak (torch.cuda.max_memory_allocated). Two T per N (T = N, T = 2N) separate what scales
with all tokens (the bf16 logits of every position) from what scales with response tokens.
The hidden state's and the head's gradients (T × hidden, vocab × hidden) are in the backward peak.
Writes $OUT/loss_head_memory.json when $OUT is set.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
from pathlib import Path


def measure(vocab: int, hidden: int, all_tokens: int, response_tokens: int, chunked: bool, entropy: bool,
            offload: bool, triton: bool = False) -> dict:
    import torch

    from engine.workers.passes.logprob import LogitOptions, token_log_probs
    from engine.workers.fsdp.offload import activation_offload

    device = torch.device("cuda", 0)
    g = torch.Generator(device=device).manual_seed(0)
    head = torch.nn.Parameter(torch.randn(vocab, hidden, device=device, dtype=torch.bfloat16, generator=g) * 0.02)
    hidden_state = torch.randn(all_tokens, hidden, device=device, dtype=torch.bfloat16, generator=g).requires_grad_()
    predict_index = torch.randperm(all_tokens, device=device, generator=g)[:response_tokens].sort().values
    labels = torch.randint(0, vocab, (response_tokens,), device=device, generator=g)
    options = LogitOptions(entropy_chunking=chunked, triton=triton)

    def forward():
        logits = torch.nn.functional.linear(hidden_state, head)[predict_index]
        return token_log_probs(logits, labels, 1.0, entropy, options)

    if triton:  # Triton's compile (and autotuning) before measuring: the first call's memory is not a step's
        with activation_offload(offload, device):
            log_probs, ent = forward()
        (-log_probs.mean() - (0.001 * ent.mean() if entropy else 0.0)).backward()
        head.grad = hidden_state.grad = None
        del log_probs, ent
    gc.collect()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    with activation_offload(offload, device):
        log_probs, ent = forward()
    torch.cuda.synchronize()
    after_forward = torch.cuda.memory_allocated() - base
    forward_peak = torch.cuda.max_memory_allocated() - base
    loss = -log_probs.mean() - (0.001 * ent.mean() if entropy else 0.0)
    torch.cuda.reset_peak_memory_stats()
    loss.backward()
    torch.cuda.synchronize()
    backward_peak = torch.cuda.max_memory_allocated() - base
    unit = response_tokens * vocab
    row = dict(all_tokens=all_tokens, response_tokens=response_tokens, chunked=chunked, entropy=entropy,
               offload=offload, triton=triton, after_forward_b=after_forward / unit, forward_peak_b=forward_peak / unit,
               backward_peak_b=backward_peak / unit,
               grads_b=(hidden_state.numel() + head.numel()) * 2 / unit)
    del loss, log_probs, ent
    head = hidden_state = None  # (not del: forward() closes over them) freed before empty_cache
    gc.collect()
    torch.cuda.empty_cache()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151936)
    parser.add_argument("--hidden", type=int, default=896)
    parser.add_argument("--response-tokens", type=int, default=8192)
    parser.add_argument("--triton", action="store_true",
                        help="also each case with the Triton head (impl_backend=triton, or use_torch_compile on CUDA)")
    parser.add_argument("--triton-only", action="store_true", help="only the Triton head's cases, at T = N")
    args = parser.parse_args()
    import torch

    rows = []
    print(f"{'T':>6s} {'N':>6s} {'head':>17s} {'entropy':>7s} {'offload':>7s} {'after fwd':>9s} {'fwd peak':>8s} "
          f"{'bwd peak':>8s}   (bytes ÷ N × vocab)", flush=True)
    n = args.response_tokens
    head_cases = (True,) if args.triton_only else (False, True) if args.triton else (False,)
    cases = [(t, chunked, entropy, offload, triton) for triton in head_cases
             for t in ((n,) if args.triton_only else (n, 2 * n))
             for chunked in (False, True) for entropy in (True, False) for offload in (False, True)]
    for all_tokens, chunked, entropy, offload, triton in cases:
        row = measure(args.vocab, args.hidden, all_tokens, n, chunked, entropy, offload, triton)
        rows.append(row)
        head = ("chunked" if chunked else "plain") + (" triton" if triton else "")
        print(f"{all_tokens:6d} {n:6d} {head:>17s} {entropy!s:>7s} {offload!s:>7s} {row['after_forward_b']:9.2f} "
              f"{row['forward_peak_b']:8.2f} {row['backward_peak_b']:8.2f}", flush=True)
    out = os.environ.get("OUT")
    if out:
        Path(out).mkdir(parents=True, exist_ok=True)
        (Path(out) / "loss_head_memory.json").write_text(json.dumps(
            {"args": vars(args), "torch": torch.__version__, "device": torch.cuda.get_device_name(0), "rows": rows},
            indent=1))


if __name__ == "__main__":
    main()
