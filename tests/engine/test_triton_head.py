"""fused_kernel_options.impl_backend=triton (engine/workers/sequence/triton_head.py) against the torch loss head.

The kernels are checked where Triton runs: on a CUDA GPU, and on the CPU through Triton's interpreter
(TRITON_INTERPRET=1, in a subprocess because the switch is read when the kernels are defined) where
Triton is installed. CPU builds of torch do not ship Triton, so CI skips both; the GPU machine runs
them (docs/benchmarks.md).

Compared with logprob._logit_terms under autograd, for fp32 and bf16 logits, a vocabulary that is
not a multiple of the kernels' block (tail lanes masked), a temperature, and gradients through the
log-probs and the entropy, through the log-probs alone, and through the entropy alone:
- fp32: values within 1e-4 (summation order over 5,000+ entries), gradients within 1e-5 of their
  largest entry;
- bf16: values within 1e-4 (both compute in fp32 from the same bf16 inputs), gradients within one
  bf16 step of their size (both round an fp32 gradient to bf16 once).
The fused head (use_fused_kernels) with the kernels against the fused head in torch: the same bounds
on the log-probs, entropy and the hidden and weight gradients.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

ROOT = Path(__file__).resolve().parents[2]
HAS_TRITON = importlib.util.find_spec("triton") is not None
VOCAB, ROWS, TEMPERATURE = 5003, 7, 0.7


def check_against_torch(device: str) -> None:
    from engine.workers.sequence.fused_head import fused_token_log_probs
    from engine.workers.passes.logprob import _logit_terms
    from engine.workers.sequence.triton_head import triton_token_log_probs

    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, VOCAB, (ROWS,), generator=g).to(device)
    grad_lp, grad_h = torch.randn(ROWS, generator=g).to(device), torch.randn(ROWS, generator=g).to(device)
    for dtype in (torch.float32, torch.bfloat16):
        base = (3 * torch.randn(ROWS, VOCAB, generator=g)).to(device=device, dtype=dtype)
        for use_lp, use_h in ((True, True), (True, False), (False, True)):
            mine, ref = base.clone().requires_grad_(), base.clone().requires_grad_()
            lp, ent = triton_token_log_probs(mine, labels, TEMPERATURE)
            ref_lp, ref_ent = _logit_terms(ref, labels, TEMPERATURE, True)
            torch.testing.assert_close(lp, ref_lp, rtol=0, atol=1e-4)
            torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-4)
            loss = (lp * grad_lp).sum() * use_lp + (ent * grad_h).sum() * use_h
            ref_loss = (ref_lp * grad_lp).sum() * use_lp + (ref_ent * grad_h).sum() * use_h
            loss.backward()
            ref_loss.backward()
            scale = float(ref.grad.float().abs().max())
            atol = scale * (1e-5 if dtype == torch.float32 else 2**-7)
            assert scale > 0
            torch.testing.assert_close(mine.grad.float(), ref.grad.float(), rtol=0, atol=atol,
                                       msg=lambda m, d=dtype, a=use_lp, b=use_h: f"{d} lp={a} entropy={b}: {m}")
    # The fused head: chunks of logits from hidden states, in torch and through the kernels.
    hidden = torch.randn(ROWS, 32, generator=g).to(device)
    weight = (0.3 * torch.randn(VOCAB, 32, generator=g)).to(device)
    results = []
    for use_triton in (False, True):
        h, w = hidden.clone().requires_grad_(), weight.clone().requires_grad_()
        lp, ent = fused_token_log_probs(h, w, labels, TEMPERATURE, with_entropy=True, chunk_size=3,
                                        use_triton=use_triton)
        ((lp * grad_lp).sum() + (ent * grad_h).sum()).backward()
        results.append((lp, ent, h.grad, w.grad))
    for name, mine, ref in zip(("log-probs", "entropy", "grad hidden", "grad weight"), results[1], results[0],
                               strict=True):
        torch.testing.assert_close(mine, ref, rtol=0, atol=1e-4, msg=name)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none; run on the GPU machine)")
def test_triton_head_on_cuda_matches_the_torch_head():
    check_against_torch("cuda")


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed (CPU builds of torch do not ship it)")
def test_triton_head_interpreted_on_cpu_matches_the_torch_head():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONPATH": os.pathsep.join(
        [str(ROOT), str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")])}
    code = "import test_triton_head as t; t.check_against_torch('cpu')"
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if "only 0-dimensional arrays can be converted" in run.stderr:
        # Triton 3.6's interpreter turns one-element arrays into Python ints, which NumPy >= 2.3 refuses.
        pytest.skip("this Triton's interpreter does not run with this NumPy (seen: Triton 3.6, NumPy 2.4)")
    assert run.returncode == 0, run.stderr[-3000:]


def test_the_triton_head_is_refused_off_cuda_and_without_triton():
    from engine.capabilities import triton_head_problems

    knobs = {"use_torch_compile": False, "use_fused_kernels": False}
    assert triton_head_problems("torch", "cpu", **knobs) == []
    assert "needs CUDA" in triton_head_problems("triton", "cpu", **knobs)[0]
    assert "not installed" in triton_head_problems("triton", "cuda", triton_found=lambda: False, **knobs)[0]
    assert triton_head_problems("triton", "cuda", triton_found=lambda: True, **knobs) == []
