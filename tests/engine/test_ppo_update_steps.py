"""ppo_update's optimizer steps: a fused Adam skips a non-finite step on the device, without a read-back first."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from engine.algos.losses import BatchCounts
from engine.workers.passes.ppo_update import MicroResult, ppo_update, skips_nonfinite_step

ROWS, PROMPT, RESPONSE = 8, 3, 4


def _batch(poisoned_rows: slice | None = None) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    batch = {
        "input_ids": torch.randint(0, 16, (ROWS, PROMPT + RESPONSE), generator=g),
        "attention_mask": torch.ones(ROWS, PROMPT + RESPONSE, dtype=torch.long),
        "responses": torch.randint(0, 16, (ROWS, RESPONSE), generator=g),
        "response_mask": torch.ones(ROWS, RESPONSE, dtype=torch.long),
        "targets": torch.randn(ROWS, RESPONSE, generator=g),
    }
    if poisoned_rows is not None:
        batch["targets"][poisoned_rows] = float("nan")
    return batch


def _update(fused: bool, batch: dict[str, torch.Tensor], mini_batch_size: int = ROWS
            ) -> tuple[nn.Module, torch.optim.Optimizer, dict[str, float]]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1, fused=fused, foreach=None if fused else False)

    def micro_step(micro: dict[str, torch.Tensor], counts: BatchCounts) -> MicroResult:
        values = model(micro["responses"]).squeeze(-1)
        loss = ((values - micro["targets"]) ** 2 * micro["response_mask"]).sum() / counts.tokens
        return MicroResult(loss, {"loss": loss.detach()}, {})

    metrics = ppo_update(model, optimizer, batch, epochs=1, mini_batch_size=mini_batch_size, micro_batch_size=4,
                         token_budget=0, grad_clip=1.0, shuffle=False, generator=torch.Generator(),
                         micro_step=micro_step, prefix="actor")
    return model, optimizer, metrics


def test_only_a_fused_adam_is_trusted_to_skip_its_own_step() -> None:
    params = [nn.Parameter(torch.zeros(2))]
    assert skips_nonfinite_step(torch.optim.AdamW(params, fused=True))
    assert not skips_nonfinite_step(torch.optim.AdamW(params, foreach=False))
    assert not skips_nonfinite_step(torch.optim.SGD(params, lr=0.1))


def test_a_fused_step_trains_the_same_as_the_one_that_reads_the_norm_first() -> None:
    fused_model, _, fused = _update(True, _batch())
    plain_model, _, plain = _update(False, _batch())
    assert fused["actor/grad_norm"] == pytest.approx(plain["actor/grad_norm"], rel=1e-6)
    assert fused["actor/loss"] == pytest.approx(plain["actor/loss"], rel=1e-6)
    torch.manual_seed(0)
    initial = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 1)).state_dict()
    for name, value in fused_model.state_dict().items():
        torch.testing.assert_close(value, plain_model.state_dict()[name])
        assert not torch.equal(value, initial[name])  # it did step


@pytest.mark.parametrize("fused", [True, False])
def test_a_non_finite_norm_leaves_weights_and_moments_and_ends_the_update(fused: bool) -> None:
    torch.manual_seed(0)
    untouched = nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 1)).state_dict()
    # Two mini batches: the first one's gradient is NaN, so neither of them may step.
    model, optimizer, metrics = _update(fused, _batch(poisoned_rows=slice(0, 1)), mini_batch_size=ROWS // 2)
    assert math.isnan(metrics["actor/grad_norm"])
    assert metrics["actor/optimizer_steps"] == 1  # the second mini batch never ran
    for name, value in model.state_dict().items():
        torch.testing.assert_close(value, untouched[name], rtol=0, atol=0)
    steps = [float(state["step"]) for state in optimizer.state.values()]
    assert steps == [0.0] * len(steps)  # a skipped step does not count (fused: its kernel undoes the increment)
    assert not hasattr(optimizer, "found_inf")  # the flag does not outlive the step


@pytest.mark.parametrize("fused", [True, False])
def test_a_fused_step_is_queued_before_the_norm_is_read_back(fused: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    from engine.workers.passes import ppo_update as module

    reads: list[int] = []

    class Watched(torch.Tensor):
        def __float__(self) -> float:  # float(norm) is the read-back (a sync on a GPU)
            reads.append(1)
            return super().__float__()

    real = module.clip_grad_norm_
    monkeypatch.setattr(module, "clip_grad_norm_", lambda model, clip: real(model, clip).as_subclass(Watched))
    reads_at_step: list[int] = []
    handle = register_optimizer_step_pre_hook(lambda *_: reads_at_step.append(len(reads)))
    try:
        _update(fused, _batch())
    finally:
        handle.remove()
    assert reads_at_step == ([0] if fused else [1])
