"""use_fused_kernels (engine/workers/sequence/fused_head.py): log-probs and entropy from the hidden states and
the head weight, chunk by chunk, equal the plain path's (logits, then engine.workers.passes.logprob).

The Function's backward is written by hand, so it is checked three ways: float64 gradcheck against
finite differences; fp32 values and gradients against autograd through the plain path; and on the
tiny model (padded, packed, with gradient checkpointing), the actor loss and the gradient of every
parameter. In fp32 the two paths differ only in matmul blocking (the plain path multiplies all rows
at once): measured ~1e-7, asserted with the packing tests' tolerances.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from test_packing import _actor_loss, _batch, _grads, _packed_copy, assert_same_gradients

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

VALUE_ATOL = 1e-5
LOSS_RTOL = 1e-6


def _head_inputs(dtype, rows=13, hidden=8, vocab=29, seed=0):
    g = torch.Generator().manual_seed(seed)
    h = torch.randn(rows, hidden, generator=g, dtype=dtype).requires_grad_()
    weight = torch.randn(vocab, hidden, generator=g, dtype=dtype).requires_grad_()
    labels = torch.randint(0, vocab, (rows,), generator=g)
    return h, weight, labels


def test_fused_function_gradients_match_finite_differences_in_float64():
    from engine.workers.sequence.fused_head import FusedLinearLogProbs

    h, weight, labels = _head_inputs(torch.float64, rows=7, hidden=5, vocab=11)
    # chunk 3 over 7 rows: two full chunks and a ragged last one; both outputs are checked.
    assert torch.autograd.gradcheck(lambda a, b: FusedLinearLogProbs.apply(a, b, labels, 0.7, 3), (h, weight))


@pytest.mark.parametrize("chunk_size", [1, 5, 64])  # one row a chunk, ragged chunks, one chunk for all
def test_fused_values_and_gradients_equal_the_plain_head_in_fp32(chunk_size):
    from engine.workers.sequence.fused_head import fused_token_log_probs
    from engine.workers.passes.logprob import token_log_probs

    h, weight, labels = _head_inputs(torch.float32)
    lp, ent = token_log_probs(h @ weight.t(), labels, 0.7, True)
    g = torch.Generator().manual_seed(1)
    w_lp, w_ent = torch.randn(lp.shape, generator=g), torch.randn(lp.shape, generator=g)
    (lp * w_lp + ent * w_ent).sum().backward()
    expected = (h.grad.clone(), weight.grad.clone())
    h.grad = weight.grad = None
    fused_lp, fused_ent = fused_token_log_probs(h, weight, labels, 0.7, True, chunk_size)
    (fused_lp * w_lp + fused_ent * w_ent).sum().backward()
    torch.testing.assert_close(fused_lp, lp, rtol=0, atol=VALUE_ATOL)
    torch.testing.assert_close(fused_ent, ent, rtol=0, atol=VALUE_ATOL)
    # grad_W sums 13 rows of O(1) terms per entry, summed in another order than the plain path's
    # matmul: entries that cancel to ~1e-3 keep fp32 rounding of ~1e-6 absolute (measured 3.7e-6).
    torch.testing.assert_close(h.grad, expected[0], rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(weight.grad, expected[1], rtol=1e-4, atol=1e-5)


@pytest.fixture(scope="module")
def actor(tiny_model_dir: Path):
    from engine.models.loading import load_causal_lm

    return load_causal_lm(tiny_model_dir)


def _variant(model, variant: str):
    if variant == "packed":
        return _packed_copy(model, "rlconf_varlen")
    model = copy.deepcopy(model)
    if variant == "checkpointed":
        model.gradient_checkpointing_enable()
        model.train()  # HF checkpoints only in training mode
    return model


@pytest.mark.parametrize("variant", ["padded", "packed", "checkpointed"])
def test_fused_actor_loss_log_probs_entropy_and_every_gradient_equal_the_plain_path(actor, variant, monkeypatch):
    from engine.workers.sequence import fused_head
    from engine.workers.passes.logprob import LogitOptions

    batch, mask = _batch(), _batch()["response_mask"].bool()
    packed = variant == "packed"
    plain_model, fused_model = _variant(actor, variant), _variant(actor, variant)
    loss, log_probs, entropy = _actor_loss(plain_model, batch, LogitOptions(packed=packed))
    loss.backward()
    calls = []
    real_backward = fused_head.FusedLinearLogProbs.backward
    monkeypatch.setattr(fused_head.FusedLinearLogProbs, "backward",
                        staticmethod(lambda ctx, *g: calls.append("backward") or real_backward(ctx, *g)))
    fused_loss, fused_log_probs, fused_entropy = _actor_loss(fused_model, batch, LogitOptions(packed=packed, fused=True))
    fused_loss.backward()
    assert calls == ["backward"]  # the fused Function, not the plain head, produced the gradients
    torch.testing.assert_close(fused_log_probs[mask], log_probs[mask], rtol=0, atol=VALUE_ATOL)
    torch.testing.assert_close(fused_entropy[mask], entropy[mask], rtol=0, atol=VALUE_ATOL)
    assert float(fused_loss.detach()) == pytest.approx(float(loss.detach()), rel=LOSS_RTOL)
    assert_same_gradients(_grads(fused_model), _grads(plain_model))
    # The head is restored: a plain call gives logits of the vocabulary's width again.
    head = fused_model.get_output_embeddings()
    assert head(torch.zeros(1, head.in_features)).shape[-1] == head.out_features


@pytest.mark.parametrize(("head", "found"), [
    (torch.nn.Linear(4, 9, bias=True), "Linear with a bias"),
    # e.g. a LoRA-wrapped head: its adapter would be left out of the fused matmul.
    (torch.nn.Sequential(torch.nn.Linear(4, 9, bias=False)), "Sequential"),
])
def test_fused_head_refuses_a_head_it_cannot_fuse_with_the_fix(head, found):
    from engine.workers.sequence.fused_head import fused_lm_head

    model = torch.nn.Module()
    model.get_output_embeddings = lambda: head
    keep = torch.ones(1, 3, dtype=torch.bool)
    with pytest.raises(ValueError, match=f"has {found}: set use_fused_kernels: false"), \
            fused_lm_head(model, keep.long(), keep, 1.0):
        pass
