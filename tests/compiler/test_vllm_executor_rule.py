"""RL372: the vLLM layouts rlconf runs (rollout.engine_kwargs.vllm.distributed_executor_backend): in the worker's
process (unset or `external_launcher`) or in processes of its own (`mp`, tensor parallel size 1)."""

from __future__ import annotations

import pytest

from rlconf.compile import compile_plan

KEY = "actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend"
VLLM = ["actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda"]


def _rl372(overrides: list[str]) -> list[str]:
    result = compile_plan("presets/quickstart.yaml", overrides)
    return [d.message for d in result.errors if d.code == "RL372"]


@pytest.mark.parametrize("executor", ["mp", "external_launcher"])
def test_the_two_layouts_pass(executor):
    assert _rl372(VLLM + [f"{KEY}={executor}"]) == []


def test_unset_is_the_in_process_layout_and_passes():
    assert _rl372(VLLM) == []


@pytest.mark.parametrize("overrides, said", [
    (VLLM + [f"{KEY}=uni"], "'uni' is not a layout rlconf runs"),
    (VLLM + [f"{KEY}=ray"], "'ray' is not a layout rlconf runs"),
    ([f"{KEY}=mp"], "rollout.name is `hf`"),
    (VLLM + [f"{KEY}=mp", "actor_rollout_ref.rollout.tensor_model_parallel_size=2", "trainer.n_gpus_per_node=2"],
     "tensor_model_parallel_size 2"),
    (VLLM + [f"{KEY}=mp", "+actor_rollout_ref.rollout.engine_kwargs.vllm.worker_extension_cls=my.Ext"],
     "worker_extension_cls with distributed_executor_backend `mp`"),
])
def test_other_layouts_are_refused_with_the_reason(overrides, said):
    (message,) = _rl372(overrides)
    assert said in message
