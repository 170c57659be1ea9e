"""Which kernels run the loss head (rlconf/loss_head.py), and that the compiler's estimate, its rules, the
launch's checks and the actor worker all follow that one answer.

use_torch_compile (verl's default: true) runs rlconf's Triton kernels on CUDA and the eager head on CPU; the
Triton kernels' numbers against the fp32 reference are checked on a GPU in tests/engine/test_triton_head.py.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from rlconf.compile import compile_plan
from rlconf.loss_head import loss_head_kernels

PRESET = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"
CUDA = ["trainer.device=cuda", "trainer.n_gpus_per_node=1"]


@pytest.mark.parametrize(("impl_backend", "use_torch_compile", "fused", "device", "kernels"), [
    ("torch", True, False, "cuda", "triton"),  # verl's defaults on a GPU
    ("torch", True, False, "cpu", "torch"),
    ("torch", False, False, "cuda", "torch"),
    ("torch", True, True, "cuda", "torch"),  # the fused head stays as it is
    ("triton", False, False, "cuda", "triton"),
    ("triton", False, True, "cuda", "triton"),  # the fused head's chunks in Triton
    ("triton", True, False, "cpu", "triton"),  # asked for on CPU: RL528 and the launch refuse it
])
def test_the_loss_heads_kernels_follow_the_backend_compile_fused_and_device(impl_backend, use_torch_compile, fused,
                                                                            device, kernels):
    assert loss_head_kernels(impl_backend, use_torch_compile, fused, device) == kernels


@pytest.mark.parametrize(("override", "triton"), [
    (CUDA, True),
    (CUDA + ["actor_rollout_ref.actor.use_torch_compile=false"], False),
    (CUDA + ["actor_rollout_ref.model.use_fused_kernels=true"], False),
    ([], False),  # the quickstart runs on CPU
])
def test_the_actor_worker_runs_the_head_the_plan_names(override, triton):
    pytest.importorskip("torch")
    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker

    resolved = compile_plan(PRESET, override).resolved
    assert resolved is not None
    options = ActorRolloutRefWorker._logit_options.fget(SimpleNamespace(resolved=resolved))
    assert options.triton is triton


def test_a_gpu_without_triton_refuses_use_torch_compile_and_names_both_fixes():
    from engine.capabilities import triton_head_problems
    from engine.problems import MachineShortfall

    def problems(device, found, compile_on):
        return triton_head_problems("torch", device, triton_found=lambda: found, use_torch_compile=compile_on,
                                    use_fused_kernels=False)

    [problem] = problems("cuda", False, True)
    assert isinstance(problem, MachineShortfall)
    assert "use_torch_compile=true" in problem and "set actor_rollout_ref.actor.use_torch_compile=false" in problem
    assert problems("cpu", False, True) == []
    assert problems("cuda", True, True) == []
    assert problems("cuda", False, False) == []


@pytest.mark.parametrize(("override", "warned"), [
    (CUDA, True),
    (CUDA + ["actor_rollout_ref.actor.use_torch_compile=false"], False),
    ([], False),  # CPU: the eager head chunks
])
def test_chunking_beside_the_triton_head_that_use_torch_compile_picks_is_called_moot(override, warned):
    result = compile_plan(PRESET, [*override, "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true"])
    rl529 = [d for d in result.diagnostics if d.code == "RL529"]
    assert bool(rl529) is warned
    if warned:
        assert "use_torch_compile on CUDA" in rl529[0].message


def test_the_first_step_line_names_no_loss_head_compile():
    pytest.importorskip("torch")
    from engine.startup import step_one_note

    resolved = compile_plan(PRESET, CUDA).resolved
    assert resolved is not None
    assert step_one_note(resolved) == ""
    with_layers = compile_plan(PRESET, [*CUDA, "actor_rollout_ref.model.compile_layers=true"]).resolved
    assert "the actor's decoder layers" in step_one_note(with_layers)
