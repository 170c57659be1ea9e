"""A plan with a served reward model (verl 0.9.1's reward loop) compiles, and the engine refuses it in one place
(engine.capabilities.served_reward_model_problems) until an engine path serves reward models."""

from __future__ import annotations

from pathlib import Path

from rlconf.compile import compile_plan

GRPO_8 = Path(__file__).resolve().parents[2] / "presets" / "grpo_7b_8gpu.yaml"
SERVED = ["reward_model.enable=true", "reward_model.model.path=Qwen/Qwen2.5-7B", "reward_model.rollout.name=vllm"]


def test_the_engine_refuses_a_served_reward_model_in_one_place_the_compiler_accepts():
    from engine.capabilities import served_reward_model_problems, unsupported_features

    resolved = compile_plan(GRPO_8, SERVED).resolved
    (problem,) = served_reward_model_problems(resolved)
    assert "reward_model.use_reward_loop=false" in problem and problem in unsupported_features(resolved)
    assert served_reward_model_problems(compile_plan(GRPO_8).resolved) == []
