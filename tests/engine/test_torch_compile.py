"""actor.use_torch_compile (engine/workers/passes/logprob.py): the loss head's fp32 logit math runs through
torch.compile on CUDA, eagerly on CPU (where the first compile costs ~14 s per worker process).

The decision, the worker's wiring and the call are checked here without compiling; the compiled
function's numbers against eager are checked once on CPU (slow: inductor compiles) and on a GPU in
tests/engine/test_kernels_gpu.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PRESET = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"


def _logits(rows=37, vocab=61, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab, generator=g).requires_grad_()
    return logits, torch.randint(0, vocab, (rows,), generator=g)


def test_compile_is_applied_on_cuda_only_and_only_with_the_knob():
    from engine.workers.passes.logprob import compile_loss_head

    assert compile_loss_head(True, "cuda") is True
    assert compile_loss_head(True, "cpu") is False
    assert compile_loss_head(False, "cuda") is False


@pytest.mark.parametrize(("override", "device", "compiled"), [
    ([], "cuda", True),  # verl's default (true) on a GPU
    ([], "cpu", False),
    (["actor_rollout_ref.actor.use_torch_compile=false"], "cuda", False),
])
def test_the_actor_worker_asks_for_the_compiled_head_from_the_plan_and_device(override, device, compiled):
    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker
    from rlconf.compile import compile_plan

    resolved = compile_plan(PRESET, override).resolved
    assert resolved is not None
    fake_worker = SimpleNamespace(resolved=resolved, device=torch.device(device))
    assert ActorRolloutRefWorker._logit_options.fget(fake_worker).compiled is compiled


@pytest.mark.parametrize("chunked", [False, True])
def test_compiled_options_route_the_logit_math_through_the_compiled_function(monkeypatch, chunked):
    from engine.workers.passes import logprob

    calls = []

    def compiled_stand_in(*args):
        calls.append(args[0].shape[0])
        return logprob._logit_terms(*args)

    monkeypatch.setattr(logprob, "_compiled_logit_terms", lambda: compiled_stand_in)
    logits, labels = _logits()
    options = logprob.LogitOptions(compiled=True, entropy_chunking=chunked, chunk_size=16)
    log_probs, entropy = logprob.token_log_probs(logits, labels, 0.7, True, options)
    (log_probs.sum() + entropy.sum()).backward()
    # Chunked: 37 rows in chunks of 16, each run forward, then recomputed in backward (last chunk first).
    assert calls == ([16, 16, 5, 5, 16, 16] if chunked else [37])


@pytest.mark.slow  # inductor's first compile: ~14 s on a 2-core machine
def test_the_compiled_logit_math_equals_eager_values_and_gradients_on_cpu():
    from engine.workers.passes import logprob

    logits, labels = _logits()
    eager_lp, eager_ent = logprob.token_log_probs(logits, labels, 0.7, True)
    (eager_lp.sum() + 0.5 * eager_ent.sum()).backward()
    eager_grad, logits.grad = logits.grad.clone(), None
    lp, ent = logprob.token_log_probs(logits, labels, 0.7, True, logprob.LogitOptions(compiled=True))
    (lp.sum() + 0.5 * ent.sum()).backward()
    # fp32, the same math fused into one kernel: rounding differences of a few ulp.
    torch.testing.assert_close(lp, eager_lp, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent, eager_ent, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits.grad, eager_grad, rtol=1e-5, atol=1e-6)
