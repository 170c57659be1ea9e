"""engine/workers/fsdp/offload.py in one process: what activation offload copies, where optimizer states go,
and when a model's shard moves. The workers' numbers with offload on and off:
tests/engine/test_offload_equivalence.py; the memory it saves on a GPU: tests/engine/test_offload_gpu.py."""

from __future__ import annotations

import pytest
from offload_spy import spy_on_offload

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")


def _tiny_lm(tiny_model_dir, checkpointing: bool):
    from engine.models.loading import load_causal_lm

    model = load_causal_lm(tiny_model_dir)
    if checkpointing:
        model.gradient_checkpointing_enable()
    return model.train()


def _grads_and_packed(model, ids, offload: bool, monkeypatch) -> tuple[dict, list, list]:
    """Gradients of a loss on `ids`, and the shapes that activation offload copied / left alone."""
    import engine.workers.fsdp.offload as offload_module

    copied, left = spy_on_offload(monkeypatch)
    model.zero_grad(set_to_none=True)
    with offload_module.activation_offload(offload, torch.device("cpu")):
        logits = model(input_ids=ids, use_cache=False).logits
    logits.float().log_softmax(-1).mean().backward()
    monkeypatch.undo()
    shapes = [[tuple(tensor.shape) for tensor in saved] for saved in (copied, left)]
    return {n: p.grad.clone() for n, p in model.named_parameters()}, *shapes


@pytest.mark.parametrize("checkpointing", [True, False], ids=["checkpointed", "not checkpointed"])
def test_activation_offload_copies_saved_activations_leaves_weights_and_keeps_the_gradients(
        tiny_model_dir, monkeypatch, checkpointing):
    model = _tiny_lm(tiny_model_dir, checkpointing)
    ids = torch.randint(10, 250, (2, 12), generator=torch.Generator().manual_seed(0))
    plain, none_copied, _ = _grads_and_packed(model, ids, offload=False, monkeypatch=monkeypatch)
    offloaded, copied, left = _grads_and_packed(model, ids, offload=True, monkeypatch=monkeypatch)
    assert none_copied == []
    for name in plain:
        torch.testing.assert_close(offloaded[name], plain[name], rtol=0, atol=0, msg=name)
    hidden = model.config.hidden_size
    # Each decoder layer's input [2, 12, hidden] is saved (the checkpoint's input, or the norm's) and copied.
    assert sum(shape == (2, 12, hidden) for shape in copied) >= model.config.num_hidden_layers
    # Weights (and views of them) are never copied: FSDP gathers them again for backward.
    weight_shapes = {tuple(p.shape) for p in model.parameters()} | {tuple(p.t().shape) for p in model.parameters()
                                                                     if p.dim() == 2}
    assert left and set(left) <= weight_shapes
    if checkpointing:  # only the layers' inputs and what lies outside them: far fewer than without
        assert len(copied) < 20


def test_optimizer_states_move_but_adams_step_counts_stay_on_the_cpu():
    from engine.workers.fsdp.offload import move_optimizer_states

    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    move_optimizer_states(optimizer, "meta")  # a second device a CPU-only machine has
    for state in optimizer.state.values():
        assert state["exp_avg"].is_meta and state["exp_avg_sq"].is_meta
        assert state["step"].device.type == "cpu"


class _Counting(torch.nn.Linear):
    moves: list[str]

    def _apply(self, fn, recurse=True):
        self.moves.append("apply")
        return super()._apply(fn, recurse)


def test_a_model_moves_once_per_outermost_use_and_only_with_param_offload():
    from engine.workers.fsdp.offload import ModelOffload

    model = _Counting(4, 3)
    model.moves = []
    optimizer = torch.optim.AdamW(model.parameters())
    offload = ModelOffload(model, optimizer, torch.device("cpu"), params=True, optimizer_states=True)
    assert model.moves == ["apply"]  # offloaded at once
    with offload.everything_on_device():
        with offload.in_use():  # a checkpoint's export inside its save: no second move
            assert model.moves == ["apply", "apply"]
    assert model.moves == ["apply"] * 3
    with offload.in_use():
        model(torch.randn(2, 4)).sum().backward()
        with offload.optimizer_step():
            optimizer.step()
    assert model.moves == ["apply"] * 5
    assert set(optimizer.state[model.weight]) == {"step", "exp_avg", "exp_avg_sq"}

    kept = _Counting(4, 3)
    kept.moves = []
    idle = ModelOffload(kept, None, torch.device("cpu"), params=False, optimizer_states=True)
    with idle.everything_on_device(), idle.in_use(), idle.optimizer_step():
        pass
    assert kept.moves == [] and not idle.optimizer_states  # no optimizer: nothing to offload


@pytest.mark.parametrize("host_copies", [False, True], ids=["fresh .cpu()", "host copies"])
def test_releasing_the_optimizer_drops_the_moments_and_their_host_copies_and_refuses_another_step(host_copies):
    """The end of a run (engine.launch, before the export): Adam's moments and the host block that held them go;
    an update after that would restart Adam from zero, so it raises instead."""
    import weakref

    from engine.workers.fsdp.offload import ModelOffload

    model = torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(model.parameters())
    offload = ModelOffload(model, optimizer, torch.device("cpu"), params=False, optimizer_states=True,
                           host_copies=host_copies)
    model(torch.randn(2, 4)).sum().backward()
    with offload.optimizer_step():
        optimizer.step()
    assert set(optimizer.state[model.weight]) == {"step", "exp_avg", "exp_avg_sq"}
    block = offload._moment_copies.copies
    assert (block is not None) == host_copies
    gone = weakref.ref(block) if block is not None else None
    del block

    offload.release_optimizer()
    assert len(optimizer.state) == 0 and all(p.grad is None for p in model.parameters())
    assert offload._moment_copies.copies is None and (gone is None or gone() is None)  # the host block is freed
    with pytest.raises(RuntimeError, match="released at the end of training"):
        with offload.optimizer_step():
            pass
