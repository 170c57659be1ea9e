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


@pytest.mark.parametrize(("override", "device", "starts"), [
    ([], "cuda", True),  # verl's default (true) on a GPU
    ([], "cpu", False),
    (["actor_rollout_ref.actor.use_torch_compile=false"], "cuda", False),
    (["actor_rollout_ref.model.use_fused_kernels=true"], "cuda", False),  # the fused head has no compiled math
])
def test_the_actor_worker_starts_the_background_compile_from_the_plan_and_device(monkeypatch, override, device, starts):
    from engine.workers.passes import logprob
    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker
    from rlconf.compile import compile_plan

    started = []
    monkeypatch.setattr(logprob.LossHeadCompile, "start", lambda self, *args: started.append(args) or self)
    resolved = compile_plan(PRESET, override).resolved
    assert resolved is not None
    fake_worker = SimpleNamespace(resolved=resolved, device=torch.device(device), _temperature=1.0,
                                  actor=SimpleNamespace(config=SimpleNamespace(vocab_size=61)))
    fake_worker._eager_logit_options = ActorRolloutRefWorker._eager_logit_options.fget(fake_worker)
    ActorRolloutRefWorker._start_loss_head_compile(fake_worker)
    assert (len(started) == 1) is starts
    if starts:  # vocabulary, compute dtype, device, temperature, the update's entropy, the plan's options
        vocab, dtype, where, temperature, training_entropy, _options = started[0]
        plan_dtype = getattr(torch, resolved.config.actor_rollout_ref.model.dtype)
        assert (vocab, dtype, where, temperature, training_entropy) == (61, plan_dtype, torch.device("cuda"), 1.0, False)


@pytest.mark.parametrize(("head", "compiled", "pending"), [
    (None, False, False),  # never asked for (CPU, or the knob off)
    (SimpleNamespace(ready=False), False, True),  # compiling in the background
    (SimpleNamespace(ready=True), True, False),
])
def test_the_worker_runs_the_compiled_head_only_once_it_is_ready(head, compiled, pending):
    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker
    from rlconf.compile import compile_plan

    resolved = compile_plan(PRESET, []).resolved
    fake_worker = SimpleNamespace(resolved=resolved, device=torch.device("cuda"), loss_head=head)
    fake_worker._eager_logit_options = ActorRolloutRefWorker._eager_logit_options.fget(fake_worker)
    options = ActorRolloutRefWorker._logit_options.fget(fake_worker)
    assert (options.compiled, options.compile_pending) == (compiled, pending)


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


def test_forward_only_calls_take_one_graph_with_the_entropy_whatever_they_ask(monkeypatch):
    from engine.workers.passes import logprob

    calls = []

    def compiled_stand_in(logits, labels, temperature, with_entropy):
        calls.append((torch.is_grad_enabled(), logits.requires_grad, with_entropy))
        return logprob._logit_terms(logits, labels, temperature, with_entropy)

    monkeypatch.setattr(logprob, "_compiled_logit_terms", lambda: compiled_stand_in)
    logits, labels = _logits()
    options = logprob.LogitOptions(compiled=True, chunk_size=64)
    with torch.no_grad():
        _, entropy = logprob.token_log_probs(logits, labels, 0.7, False, options)
    assert entropy is None  # computed in the graph, not returned
    logprob.token_log_probs(logits.detach(), labels, 0.7, True, options)  # grad mode on, nothing requires grad
    logprob.token_log_probs(logits, labels, 0.7, False, options)  # the update without an entropy term
    assert calls == [(False, False, True), (False, False, True), (True, True, False)]


@pytest.mark.parametrize(("entropy", "chunked", "expected"), [
    (True, False, [13, 13, 11]),  # compiled 12 B × 37 rows; eager 4 B × 37 + 22 B × chunk: 296 // 22 = 13
    (False, False, [8, 8, 8, 8, 5]),  # compiled 8 B × 37; eager 4 B × 37 + 18 B × chunk: 148 // 18 = 8
    (True, True, [7, 7, 7, 7, 7, 2]),  # the plan chunks by 16: compiled 4 B × 37 + 10 B × 16; 160 // 22 = 7
])
def test_the_eager_head_waiting_for_the_compile_chunks_within_the_compiled_heads_bytes(monkeypatch, entropy, chunked,
                                                                                        expected):
    from engine.workers.passes import logprob

    seen = []
    real_checkpoint = logprob.checkpoint

    def spy(fn, logits, *args, **kwargs):
        seen.append(logits.shape[0])
        return real_checkpoint(fn, logits, *args, **kwargs)

    monkeypatch.setattr(logprob, "checkpoint", spy)
    logits, labels = _logits()
    options = logprob.LogitOptions(compile_pending=True, entropy_chunking=chunked, chunk_size=16)
    log_probs, ent = logprob.token_log_probs(logits, labels, 0.7, entropy, options)
    assert seen == expected
    eager_lp, eager_ent = logprob.token_log_probs(logits, labels, 0.7, entropy)
    torch.testing.assert_close(log_probs, eager_lp)
    if entropy:
        torch.testing.assert_close(ent, eager_ent)


def recorded_graphs(monkeypatch) -> list:
    """The compiled loss head, compiled by a backend that records each graph dynamo hands it (a stand-in for
    inductor: the same guards, no codegen); the list fills as graphs are made."""
    from engine.workers.passes import logprob

    graphs: list = []

    def recording_backend(graph, example_inputs):
        graphs.append(graph)
        return graph.forward

    compiled = torch.compile(logprob._logit_terms, dynamic=True, backend=recording_backend)
    monkeypatch.setattr(logprob, "_compiled_logit_terms", lambda: compiled)
    return graphs


def test_the_background_compile_makes_every_graph_a_step_uses(monkeypatch):
    """The stand-in batch's two graphs serve every call of a step, at row counts it never had; a
    backend that records what dynamo hands it stands in for inductor (same guards, no codegen)."""
    from engine.workers.passes import logprob

    graphs = recorded_graphs(monkeypatch)
    head = logprob.LossHeadCompile()
    assert not head.ready
    head.start(61, torch.float32, torch.device("cpu"), 0.7, False, logprob.LogitOptions(chunk_size=16))
    assert head.wait(120) and head.ready and head.error is None and head.seconds > 0
    assert len(graphs) == 2  # forward-only, and the update's forward (backward: autograd's own here)
    options = logprob.LogitOptions(compiled=True, chunk_size=16)
    for rows in (37, 5, 100, 33):  # 33 = 2 × 16 + 1: the lone row joins the chunk before it
        logits, labels = _logits(rows)
        with torch.no_grad():
            logprob.token_log_probs(logits, labels, 0.7, True, options)  # old log-probs
            logprob.token_log_probs(logits, labels, 0.7, False, options)  # reference log-probs
        log_probs, _ = logprob.token_log_probs(logits, labels, 0.7, False, options)  # the update
        log_probs.sum().backward()
        logprob.token_log_probs(logits.detach(), labels, 0.7, True, options)  # the entropy metric
    assert len(graphs) == 2


def test_a_failed_background_compile_leaves_the_eager_head_and_says_why(monkeypatch):
    from engine.workers.passes import logprob

    def broken(*args):
        raise RuntimeError("inductor could not build a kernel")

    monkeypatch.setattr(logprob, "_compiled_logit_terms", lambda: broken)
    head = logprob.LossHeadCompile().start(61, torch.float32, torch.device("cpu"), 0.7, True, logprob.LogitOptions())
    assert head.wait(60) and not head.ready
    assert head.error == "RuntimeError: inductor could not build a kernel"


@pytest.mark.parametrize(("rows", "size", "sizes"), [(37, 16, [16, 16, 5]), (33, 16, [16, 17]), (1, 16, [1]),
                                                      (32, 16, [16, 16]), (17, 16, [17])])
def test_chunks_never_end_in_a_lone_row(rows, size, sizes):
    from engine.workers.passes.logprob import _chunk_sizes

    assert _chunk_sizes(rows, size) == sizes


@pytest.mark.parametrize(("override", "said"), [
    (["trainer.device=cuda"], True),
    (["trainer.device=cuda", "actor_rollout_ref.actor.use_torch_compile=false"], False),
    ([], False),  # the quickstart runs on CPU, where the head is never compiled
])
def test_the_first_step_line_says_when_the_loss_head_compiles_in_the_background(override, said):
    from engine.startup import step_one_note
    from rlconf.compile import compile_plan

    resolved = compile_plan(PRESET, override).resolved
    assert resolved is not None
    assert ("the loss head compiles in the background" in step_one_note(resolved)) is said


@pytest.mark.parametrize("training_entropy", [True, False])
def test_the_background_compiles_graphs_serve_a_models_padded_and_chunked_calls(monkeypatch, tiny_model_dir,
                                                                               training_entropy):
    """The engine's real inputs: logits as views of bases of every shape (a chunk of the rows, a padded
    batch reshaped, one packed row) and labels as views of [b, R] responses. The warm-up's two graphs serve
    them all, chunked or not (the guards once recompiled on them: labels._base vs logits by duck sizing)."""
    from rows import rollout_rows

    from engine.models.loading import load_causal_lm
    from engine.workers.passes import logprob

    graphs = recorded_graphs(monkeypatch)
    model = load_causal_lm(tiny_model_dir).to(dtype=torch.bfloat16)
    vocab = model.config.vocab_size
    batch = rollout_rows([3, 8, 1, 5], [6, 2, 4, 5], 8, 6, torch.Generator().manual_seed(0))
    head = logprob.LossHeadCompile().start(vocab, torch.bfloat16, torch.device("cpu"), 0.7, training_entropy,
                                           logprob.LogitOptions())
    assert head.wait(120) and head.ready, head.error
    assert len(graphs) == 2
    for options in (logprob.LogitOptions(compiled=True), logprob.LogitOptions(compiled=True, chunk_size=5),
                    logprob.LogitOptions(compiled=True, chunk_size=7, entropy_chunking=True)):
        with torch.no_grad():
            logprob.response_log_probs(model, batch, 0.7, True, options)  # old log-probs
            logprob.response_log_probs(model, batch, 0.7, False, options)  # reference log-probs
        log_probs, entropy = logprob.response_log_probs(model, batch, 0.7, training_entropy, options,
                                                        entropy_metric=not training_entropy)
        (log_probs.sum() + (entropy.sum() if training_entropy else 0.0)).backward()
    packed = torch.randn(1, 50, vocab, dtype=torch.bfloat16, requires_grad=True)  # one packed row's logits
    log_probs, _ = logprob.token_log_probs(packed[0], torch.randint(0, vocab, (50,)), 0.7, training_entropy,
                                           logprob.LogitOptions(compiled=True))
    log_probs.sum().backward()
    assert len(graphs) == 2
    assert packed.grad is not None and packed.grad.abs().sum() > 0  # the gradient passes the unviewing


def test_the_background_compile_is_started_where_no_vllm_engine_will_start(monkeypatch, tmp_path):
    """HF generate (and a rollout pool of its own) start no vLLM engine in the actor's process: init_model starts
    the loss head's compile itself (it returns at once on CPU, where the head runs eagerly)."""
    from launching import compile_preset, train_in_process

    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker

    started = []
    real = ActorRolloutRefWorker._start_loss_head_compile
    monkeypatch.setattr(ActorRolloutRefWorker, "_start_loss_head_compile",
                        lambda self: started.append(self.rank) or real(self))
    train_in_process(compile_preset("quickstart.yaml", ["trainer.total_training_steps=1",
                                                        "trainer.n_gpus_per_node=1"]), tmp_path / "run")
    assert started == [0]
