"""What the loss head saves for backward, counted on the engine's own code, against the memory
estimate's coefficients (rlconf/estimate.py `loss_head_bytes`), in bytes per response token × vocab.

The head runs as in a training micro step: bf16 logits of every position from a bf16 head weight,
the response positions picked out, then engine.workers.passes.logprob.token_log_probs. The peak's gradients
and temporaries are not saved tensors: bench/loss_head_memory.py measures those on a GPU.
"""

from __future__ import annotations

import pytest

from offload_spy import spy_on_offload

from rlconf.estimate import loss_head_bytes

torch = pytest.importorskip("torch")

ALL_TOKENS, RESPONSE_TOKENS, VOCAB, HIDDEN, CHUNK = 80, 64, 4096, 32, 16


def _run_head(chunked: bool, entropy: bool, hooks_context) -> None:
    """The head's forward under `hooks_context` (which sees every tensor autograd saves)."""
    from engine.workers.passes.logprob import LogitOptions, token_log_probs

    g = torch.Generator().manual_seed(0)
    head = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=g).to(torch.bfloat16))
    hidden = torch.randn(ALL_TOKENS, HIDDEN, generator=g).to(torch.bfloat16).requires_grad_()
    # Response positions scattered among the prompt's, as packing's predict_index picks them.
    predict_index = torch.randperm(ALL_TOKENS, generator=g)[:RESPONSE_TOKENS].sort().values
    labels = torch.randint(0, VOCAB, (RESPONSE_TOKENS,), generator=g)
    options = LogitOptions(entropy_chunking=chunked, chunk_size=CHUNK)
    with hooks_context:
        logits = torch.nn.functional.linear(hidden, head)[predict_index]
        log_probs, ent = token_log_probs(logits, labels, 0.7, entropy, options)
    loss = -log_probs.mean() - (ent.mean() if entropy else 0.0)
    loss.backward()  # the saved tensors serve a real backward
    assert head.grad is not None and torch.isfinite(head.grad.float()).all()


def _vocab_wide(tensor) -> bool:
    return tensor.dim() == 2 and tensor.shape[-1] == VOCAB


@pytest.mark.parametrize("chunked", [False, True], ids=["plain", "chunked"])
@pytest.mark.parametrize("entropy", [True, False], ids=["entropy", "no_entropy"])
def test_bytes_the_loss_head_saves_per_response_token_and_vocab_match_the_estimate(chunked, entropy):
    from engine.workers.fsdp.offload import _is_parameter

    saved: dict[int, int] = {}  # storage address -> bytes: one tensor saved by several ops is held once
    parameters = []

    def pack(tensor):
        if _is_parameter(tensor):
            parameters.append(tuple(tensor.shape))
        elif _vocab_wide(tensor):
            storage = tensor.untyped_storage()
            saved[storage.data_ptr()] = storage.nbytes()
        return tensor

    _run_head(chunked, entropy, torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor))
    per_token_vocab = sum(saved.values()) / (RESPONSE_TOKENS * VOCAB)
    # Hand count: plain, the fp32 logits ÷ temperature (4 B) and, with the entropy, their softmax
    # (4 B); chunked, the bf16 response logits (2 B) that each chunk's recompute starts from. Never the
    # bf16 logits of all ALL_TOKENS positions (that would be 2 B × 80/64 = 2.5).
    assert per_token_vocab == {(False, True): 8, (False, False): 4, (True, True): 2, (True, False): 2}[chunked, entropy]
    assert per_token_vocab == loss_head_bytes(chunked, entropy).saved
    # The only parameter saved is the head's weight (transposed by linear): activation offload leaves it.
    assert parameters == [(HIDDEN, VOCAB)]


@pytest.mark.parametrize("chunked", [False, True], ids=["plain", "chunked"])
def test_activation_offload_sends_every_vocab_wide_saved_tensor_to_the_cpu(chunked, monkeypatch):
    """Under the engine's offload nothing [tokens, vocab] stays on the device between forward and
    backward, so the estimate's offloaded head keeps only what the backward's peak reads back."""
    import engine.workers.fsdp.offload as offload_module

    copied, left = spy_on_offload(monkeypatch)
    _run_head(chunked, True, offload_module.activation_offload(True, torch.device("cpu")))
    # Left on the device: the head's weight alone (a parameter, gathered again for backward).
    assert [(tuple(t.shape), offload_module._is_parameter(t)) for t in left] == [((HIDDEN, VOCAB), True)]
    # Each save is its own copy: plain, the fp32 logits three times (logsumexp, the label's gather,
    # softmax × logits) and the softmax twice = 5 × 4 B of host memory; chunked, the bf16 rows once.
    host_bytes = sum(t.numel() * t.element_size() for t in copied if _vocab_wide(t))
    assert host_bytes / (RESPONSE_TOKENS * VOCAB) == (2 if chunked else 20)
    head = loss_head_bytes(chunked, True)
    assert head.read_back <= head.saved  # what comes back at the peak is part of what was sent


def test_the_offloaded_head_peak_is_lower_by_the_saved_bytes_the_peak_does_not_read():
    # Hand-computed from the H100 measurement (bench/loss_head_memory.py): plain with the entropy
    # 24 -> 20 B, without 20 -> 20 B; chunked 4 -> 2 B per token plus the chunk's fp32 math.
    assert [loss_head_bytes(False, True).per_token(offload) for offload in (False, True)] == [24, 20]
    assert [loss_head_bytes(False, False).per_token(offload) for offload in (False, True)] == [20, 20]
    assert [loss_head_bytes(True, True).per_token(offload) for offload in (False, True)] == [4, 2]
    assert (loss_head_bytes(True, True).chunk_working, loss_head_bytes(True, False).chunk_working) == (22, 18)


def test_the_fused_head_saves_nothing_vocab_wide_and_8_bytes_per_response_token():
    """use_fused_kernels (engine/workers/sequence/fused_head.py): the estimate's `saved` is 0 per token × vocab."""
    from engine.workers.sequence.fused_head import fused_token_log_probs
    from engine.workers.fsdp.offload import _is_parameter

    g = torch.Generator().manual_seed(0)
    head = torch.nn.Parameter(torch.randn(VOCAB, HIDDEN, generator=g).to(torch.bfloat16))
    hidden = torch.randn(RESPONSE_TOKENS, HIDDEN, generator=g).to(torch.bfloat16).requires_grad_()
    labels = torch.randint(0, VOCAB, (RESPONSE_TOKENS,), generator=g)
    saved = []

    def pack(tensor):
        saved.append((tuple(tensor.shape), tensor.dtype, _is_parameter(tensor)))
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        log_probs, entropy = fused_token_log_probs(hidden, head, labels, 0.7, True, CHUNK)
    (-log_probs.mean() - entropy.mean()).backward()
    assert head.grad is not None and torch.isfinite(head.grad.float()).all()
    # Hand list: the head's input and weight, the labels, and per token the fp32 logsumexp and
    # entropy (2 × 4 B); nothing with a vocab-wide row.
    assert sorted(saved, key=str) == sorted([
        ((RESPONSE_TOKENS, HIDDEN), torch.bfloat16, False), ((VOCAB, HIDDEN), torch.bfloat16, True),
        ((RESPONSE_TOKENS,), torch.int64, False),
        ((RESPONSE_TOKENS,), torch.float32, False), ((RESPONSE_TOKENS,), torch.float32, False)], key=str)
    assert loss_head_bytes(False, True, fused=True).saved == 0
