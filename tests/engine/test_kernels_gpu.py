"""Kernel knobs on a GPU: model.use_liger (engine/models/liger.py) and model.use_fused_kernels in bf16.

Liger's Triton kernels need CUDA, so this runs on the GPU machine only. The tiny Qwen2 model's
log-probs with liger's RMSNorm / SwiGLU / RoPE must stay within bf16 rounding of the unpatched
model's: bf16 keeps 8 mantissa bits (relative step 2^-8 ≈ 0.004), and log-probs of a 509-token
vocabulary are ~ -6, so one rounding step is ~0.025; asserted at 0.1 (a few steps through the
layers). A wrong kernel (e.g. RMSNorm without its weight) moves them by O(1).
"""

from __future__ import annotations

import copy
import importlib.util

import pytest
from rows import rollout_rows

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none; run on the GPU machine)"),
]
needs_liger = pytest.mark.skipif(importlib.util.find_spec("liger_kernel") is None,
                                 reason="needs liger-kernel (pip install 'rlconf[liger]')")

BF16_LOG_PROB_ATOL = 0.1


def _cuda_batch():
    g = torch.Generator().manual_seed(0)
    batch = rollout_rows([3, 8, 1, 5], [6, 2, 4, 5], 8, 6, g)
    return {k: v.cuda() for k, v in batch.items()}


def _bf16_model(tiny_model_dir):
    from engine.models.loading import load_causal_lm

    return load_causal_lm(tiny_model_dir).to(device="cuda", dtype=torch.bfloat16)


@needs_liger
def test_liger_patches_every_norm_and_mlp_and_keeps_log_probs_within_bf16_rounding(tiny_model_dir, monkeypatch):
    from transformers.models.qwen2 import modeling_qwen2

    from engine.models.liger import apply_liger, liger_module_count
    from engine.workers.passes.logprob import response_log_probs

    # Liger replaces qwen2's module-level RoPE function for the whole process: restored after this test,
    # so the tests after it (compiled layers, which cannot trace Liger's kernels) see transformers' own.
    monkeypatch.setattr(modeling_qwen2, "apply_rotary_pos_emb", modeling_qwen2.apply_rotary_pos_emb)
    norm_class, mlp_class = modeling_qwen2.Qwen2RMSNorm, modeling_qwen2.Qwen2MLP

    model, batch = _bf16_model(tiny_model_dir), _cuda_batch()
    mask = batch["response_mask"].bool()
    # Before patching: liger also swaps qwen2's module-level RoPE function, for every model after it.
    with torch.no_grad():
        plain, _ = response_log_probs(model, batch, 0.7)
    assert liger_module_count(model) == 0
    layers = model.config.num_hidden_layers
    # Two RMSNorms per layer and the final norm, one SwiGLU MLP per layer.
    assert apply_liger(model) == 3 * layers + 1
    # Its RMSNorm and MLP classes are put back (apply_liger): models built later get transformers' own.
    assert (modeling_qwen2.Qwen2RMSNorm, modeling_qwen2.Qwen2MLP) == (norm_class, mlp_class)
    assert liger_module_count(_bf16_model(tiny_model_dir)) == 0
    log_probs, _ = response_log_probs(model, batch, 0.7)
    assert log_probs.requires_grad
    torch.testing.assert_close(log_probs[mask], plain[mask], rtol=0, atol=BF16_LOG_PROB_ATOL)
    (-log_probs[mask].mean()).backward()  # liger's backward kernels run and give finite gradients
    assert all(torch.isfinite(p.grad.float()).all() for p in model.parameters() if p.grad is not None)


def test_fused_head_in_bf16_on_cuda_keeps_log_probs_within_bf16_rounding(tiny_model_dir):
    from engine.workers.passes.logprob import LogitOptions, response_log_probs

    model, batch = _bf16_model(tiny_model_dir), _cuda_batch()
    mask = batch["response_mask"].bool()
    fused_model = copy.deepcopy(model)
    plain, plain_entropy = response_log_probs(model, batch, 0.7, True)
    fused, fused_entropy = response_log_probs(fused_model, batch, 0.7, True, LogitOptions(fused=True))
    torch.testing.assert_close(fused[mask], plain[mask], rtol=0, atol=BF16_LOG_PROB_ATOL)
    torch.testing.assert_close(fused_entropy[mask], plain_entropy[mask], rtol=0, atol=BF16_LOG_PROB_ATOL)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_the_triton_head_through_the_engines_passes_equals_the_eager_head(tiny_model_dir, packed):
    """use_torch_compile's head on CUDA (rlconf/loss_head.py): the update's log-probs and entropy with their
    gradients, the forward-only pass and the entropy metric, against the eager head on the same bf16 logits."""
    from engine.workers.passes.logprob import LogitOptions, response_log_probs

    eager_model, batch = _bf16_model(tiny_model_dir), _cuda_batch()
    triton_model = copy.deepcopy(eager_model)
    mask = batch["response_mask"].bool()
    eager, triton = LogitOptions(packed=packed), LogitOptions(packed=packed, triton=True)
    runs = {}
    for name, model, options in (("eager", eager_model, eager), ("triton", triton_model, triton)):
        log_probs, entropy = response_log_probs(model, batch, 0.7, True, options)
        (-(log_probs[mask].mean()) - 0.01 * entropy[mask].mean()).backward()
        with torch.no_grad():
            old, _ = response_log_probs(model, batch, 0.7, False, options)
        _, metric = response_log_probs(model, batch, 0.7, False, options, entropy_metric=True)
        runs[name] = (log_probs.detach(), entropy.detach(), old, metric, model.lm_head.weight.grad.float())
    # The same bf16 logits feed both; the fp32 math differs only in rounding (the Triton gradient is written in bf16).
    for got, want in zip(runs["triton"][:4], runs["eager"][:4], strict=True):
        torch.testing.assert_close(got[mask], want[mask], rtol=1e-4, atol=1e-4)
    assert not runs["triton"][3].requires_grad  # the metric leaves autograd
    torch.testing.assert_close(runs["triton"][4], runs["eager"][4], rtol=2e-2, atol=1e-3)


@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
def test_compiled_decoder_layers_on_cuda_match_eager_within_bf16_rounding(tiny_model_dir, packed):
    """model.compile_layers on a GPU: inductor's fused layers (and, packed, torch's varlen kernel traced
    into the graph) give the eager layers' log-probs up to bf16 rounding, and the same gradients."""
    from engine.models.compile import compile_decoder_layers
    from engine.workers.fsdp.sharding import decoder_layers
    from engine.workers.passes.logprob import LogitOptions, response_log_probs
    from engine.workers.sequence.packing import use_packed_attention

    model, batch = _bf16_model(tiny_model_dir), _cuda_batch()
    if packed:
        use_packed_attention(model, torch.device("cuda"))
    compiled_model = copy.deepcopy(model)
    assert compile_decoder_layers(decoder_layers(compiled_model)) == model.config.num_hidden_layers
    mask = batch["response_mask"].bool()
    grads = []
    for m in (model, compiled_model):
        log_probs, _ = response_log_probs(m, batch, 0.7, False, LogitOptions(packed=packed))
        (-log_probs[mask].float().mean()).backward()
        grads.append(torch.cat([p.grad.float().flatten() for p in m.parameters()]))
        if m is model:
            eager = log_probs.detach()
    torch.testing.assert_close(log_probs.detach()[mask], eager[mask], rtol=0, atol=BF16_LOG_PROB_ATOL)
    assert torch.nn.functional.cosine_similarity(grads[0], grads[1], dim=0) > 0.99


def _varlen_kernel(name: str):
    """rlconf_varlen's CUDA kernels: torch's flash operator, or flash-attn-4's (where installed)."""
    if name == "torch_flash":
        from engine.workers.sequence.packing import flash_varlen_call

        return flash_varlen_call
    from engine.workers.sequence.fa4_attention import fa4_available, fa4_varlen_call

    if not fa4_available():
        pytest.skip("needs flash-attn-4 on an SM90+ GPU (pip install flash-attn-4)")
    return fa4_varlen_call


@pytest.mark.parametrize("kernel", ["torch_flash", "flash_attn_4"])
@pytest.mark.parametrize("kv_heads", [2, 6], ids=["gqa", "mha"])
def test_flash_varlen_call_keeps_sequences_apart_with_fewer_kv_heads(kv_heads, kernel):
    """rlconf_varlen's CUDA kernels (key/value heads as they are) against causal SDPA one sequence at a
    time with the heads repeated: outputs and q/k/v gradients in bf16."""
    from engine.workers.sequence.packing import _sdpa_per_sequence

    call = _varlen_kernel(kernel)
    g = torch.Generator(device="cuda").manual_seed(0)
    bounds = [0, 5, 130, 131, 400]
    q, k, v = (torch.randn(bounds[-1], heads, 64, device="cuda", dtype=torch.bfloat16, generator=g).requires_grad_()
               for heads in (6, kv_heads, kv_heads))
    cu = torch.tensor(bounds, dtype=torch.int32, device="cuda")
    out = call(q, k, v, cu, 269, 0.125)
    grad = torch.randn_like(out)
    got = (out, *torch.autograd.grad(out, (q, k, v), grad))

    qf, kf, vf = (t.detach().float().requires_grad_() for t in (q, k, v))
    repeat = 6 // kv_heads
    ref = _sdpa_per_sequence(qf, kf.repeat_interleave(repeat, dim=1), vf.repeat_interleave(repeat, dim=1), bounds, 0.125)
    expected = (ref, *torch.autograd.grad(ref, (qf, kf, vf), grad.float()))
    for name, a, b in zip(("out", "dq", "dk", "dv"), got, expected, strict=True):
        assert a.shape == b.shape, name
        torch.testing.assert_close(a.float(), b, rtol=0.02, atol=0.02, msg=name)


def test_flash_attn_4_stays_inside_a_compiled_graph_and_matches_its_eager_call():
    """The custom ops keep model.compile_layers' layer one graph (fullgraph: a graph break raises),
    with the row length symbolic, and give the eager call's outputs and gradients."""
    from engine.workers.sequence.fa4_attention import fa4_varlen_backward, fa4_varlen_forward

    call = _varlen_kernel("flash_attn_4")
    g = torch.Generator(device="cuda").manual_seed(1)

    def inputs(bounds):
        q, k, v = (torch.randn(bounds[-1], heads, 128, device="cuda", dtype=torch.bfloat16, generator=g)
                   for heads in (12, 2, 2))
        return q, k, v, torch.tensor(bounds, dtype=torch.int32, device="cuda"), max(
            b - a for a, b in zip(bounds[:-1], bounds[1:], strict=False))

    def layer(q, k, v, cu, longest):
        return call(q * 1.5, k, v, cu, longest, None).square().sum()

    compiled = torch.compile(layer, fullgraph=True, dynamic=True)
    for bounds in ([0, 100, 357, 900], [0, 640, 641, 1200]):
        q, k, v, cu, longest = inputs(bounds)
        results = []
        for fn in (layer, compiled):
            leaves = [t.clone().requires_grad_() for t in (q, k, v)]
            loss = fn(*leaves, cu, longest)
            results.append((loss, *torch.autograd.grad(loss, leaves)))
        for name, a, b in zip(("loss", "dq", "dk", "dv"), *results, strict=True):
            torch.testing.assert_close(a, b, msg=name)
    q, k, v, cu, longest = inputs([0, 100, 357, 900])
    torch.library.opcheck(fa4_varlen_forward, (q.requires_grad_(), k.requires_grad_(), v.requires_grad_(), cu, longest,
                                               128 ** -0.5), test_utils=("test_schema", "test_faketensor"))
    out, lse = fa4_varlen_forward(q, k, v, cu, longest, 128 ** -0.5)
    torch.library.opcheck(fa4_varlen_backward, (torch.randn_like(out), q, k, v, out, lse, cu, longest, 128 ** -0.5),
                          test_utils=("test_schema", "test_faketensor"))
