"""The order a launch starts its workers in: the critic and the FSDP reward model load in their own processes
while the actor loads, and every model is loaded before the rollout engine starts (vLLM's free-memory check and
profiling must see every resident of the GPU)."""

from __future__ import annotations

from typing import Any

import pytest
from launching import compile_preset

pytest.importorskip("torch")

INFO = {"rank": 0, "device": "cpu", "backend": "gloo", "params": 1e6, "param_dtype": "torch.float32",
        "compute_dtype": "torch.float32"}


def recording_factory(events: list[tuple[str, ...]]):
    """A group factory whose groups run nothing and record when each call is started and when it is waited for."""

    class Group:
        def __init__(self, worker_cls: type, role: str, world_size: int, **kwargs: Any) -> None:
            self.role, self.world_size = role, world_size
            events.append((role, "placed"))

        def submit_all(self, method: str, *args: Any) -> list[str]:
            events.append((self.role, "submit", method))
            return [method]

        def collect(self, refs: list[str]) -> list[dict]:
            events.append((self.role, "collect", refs[0]))
            return [INFO] * self.world_size

        def call_all(self, method: str, *args: Any) -> list[dict]:
            events.append((self.role, "call", method))
            return [INFO] * self.world_size

    return Group


def test_the_critic_and_reward_model_load_beside_the_actor_and_before_the_rollout_engine(tmp_path, monkeypatch):
    from engine.trainer import build_trainer

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    # A GPU plan (the groups run nothing, so no GPU is touched), with vLLM: the launch has an engine to start.
    resolved = compile_preset("ppo_reward_model.yaml", ["trainer.device=cuda", "trainer.n_gpus_per_node=1",
                                                        "actor_rollout_ref.rollout.name=vllm"])
    events: list[tuple[str, ...]] = []
    build_trainer(resolved, tmp_path / "run", recording_factory(events), log=lambda line: None)
    started = [e[0] for e in events if e[1:] == ("submit", "init_model")]
    assert started == ["actor_rollout_ref", "critic", "reward_model"]
    first_wait = next(i for i, e in enumerate(events) if e[1] == "collect")
    assert all(events.index((role, "submit", "init_model")) < first_wait for role in started)  # all loading at once
    engine = events.index(("actor_rollout_ref", "call", "start_rollout"))
    assert all(events.index((role, "collect", "init_model")) < engine for role in started)
