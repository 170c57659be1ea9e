"""The order a launch starts its workers in: the critic and the FSDP reward model load in their own processes
while the actor loads, and every model is loaded before the rollout engine starts (vLLM's free-memory check and
profiling must see every resident of the GPU); engines on GPUs of their own (the off-policy rollout pool, a served
reward model's own pool) start while the actor loads."""

from __future__ import annotations

from typing import Any

import pytest
from launching import compile_preset

pytest.importorskip("torch")

INFO = {"rank": 0, "device": "cpu", "backend": "gloo", "params": 1e6, "param_dtype": "torch.float32",
        "compute_dtype": "torch.float32", "sleeps": False, "start_seconds": 0.0}  # the last two: a served scorer's


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


def test_roles_load_one_after_another_where_their_host_copies_would_not_fit(tmp_path, monkeypatch):
    import engine.trainer as trainer_module
    from engine.trainer import build_trainer

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("ppo_reward_model.yaml", ["trainer.device=cuda", "trainer.n_gpus_per_node=1",
                                                        "actor_rollout_ref.rollout.name=vllm"])
    monkeypatch.setattr(trainer_module, "host_available_bytes", lambda: 1024)  # a node with 1 KiB free
    events: list[tuple[str, ...]] = []
    build_trainer(resolved, tmp_path / "run", recording_factory(events), log=lambda line: None)
    loads = [e for e in events if e[2:] == ("init_model",)]
    assert loads == [("actor_rollout_ref", "submit", "init_model"), ("actor_rollout_ref", "collect", "init_model"),
                     ("critic", "submit", "init_model"), ("critic", "collect", "init_model"),
                     ("reward_model", "submit", "init_model"), ("reward_model", "collect", "init_model")]


def test_host_copies_count_twice_the_weight_files_per_rank_within_half_the_available_memory(tmp_path):
    from engine.trainer import load_together_fits

    model = tmp_path / "model"
    model.mkdir()
    (model / "model.safetensors").write_bytes(b"\0" * 1000)
    (model / "config.json").write_text("{}")  # not weights
    # Two roles of 2 ranks: 2 × 1000 B × 2 ranks × 2 roles = 8000 B, against half of what is available.
    assert load_together_fits([(model, 2), (model, 2)], available=16_000)
    assert not load_together_fits([(model, 2), (model, 2)], available=15_999)
    assert not load_together_fits([(model, 2)], available=None)  # unknown: one after another


class ConnectedPool:
    """RolloutPool without the weight group's rendezvous: the order test's groups run nothing."""

    def __init__(self, resolved: Any, group: Any, dispatch: Any) -> None:
        self.group = group

    def connect(self, actor: Any) -> int:
        return 0


@pytest.mark.parametrize("rollout", ["vllm", "hf"])
def test_the_off_policy_rollout_pool_starts_its_engine_while_the_actor_loads(tmp_path, monkeypatch, rollout):
    import engine.trainer as trainer_module
    from engine.trainer import build_trainer

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(trainer_module, "RolloutPool", ConnectedPool)
    monkeypatch.setattr(trainer_module, "host_available_bytes", lambda: 2**40)  # an HF pool's copy fits
    resolved = compile_preset("quickstart_offpolicy.yaml", ["trainer.device=cuda",
                                                            f"actor_rollout_ref.rollout.name={rollout}"])
    events: list[tuple[str, ...]] = []
    build_trainer(resolved, tmp_path / "run", recording_factory(events), log=lambda line: None)
    loads = [e for e in events if e[2:] == ("init_model",)]
    # The pool's GPUs are its own: both start before the launch waits for either.
    assert loads == [("actor_rollout_ref", "submit", "init_model"), ("rollout", "submit", "init_model"),
                     ("actor_rollout_ref", "collect", "init_model"), ("rollout", "collect", "init_model")]
    assert ("actor_rollout_ref", "call", "start_rollout") not in events  # the actor's GPU runs no engine


def test_an_hf_rollout_pool_waits_for_the_actor_where_their_host_copies_would_not_fit(tmp_path, monkeypatch):
    import engine.trainer as trainer_module
    from engine.trainer import build_trainer

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(trainer_module, "RolloutPool", ConnectedPool)
    monkeypatch.setattr(trainer_module, "host_available_bytes", lambda: 1024)
    resolved = compile_preset("quickstart_offpolicy.yaml", ["trainer.device=cuda", "actor_rollout_ref.rollout.name=hf"])
    events: list[tuple[str, ...]] = []
    build_trainer(resolved, tmp_path / "run", recording_factory(events), log=lambda line: None)
    loads = [e for e in events if e[2:] == ("init_model",)]
    assert loads == [("actor_rollout_ref", "submit", "init_model"), ("actor_rollout_ref", "collect", "init_model"),
                     ("rollout", "submit", "init_model"), ("rollout", "collect", "init_model")]


@pytest.mark.parametrize("own_pool", [True, False])
def test_a_served_reward_model_on_its_own_pool_starts_while_the_actor_loads_and_a_colocated_one_last(
        tmp_path, monkeypatch, own_pool):
    from engine.trainer import build_trainer

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    served = ["trainer.device=cuda", "trainer.n_gpus_per_node=1", "actor_rollout_ref.rollout.name=vllm",
              "reward_model.use_reward_loop=true", "reward_model.rollout.name=vllm",
              "reward_model.rollout.tensor_model_parallel_size=1"]
    pool = ["reward_model.enable_resource_pool=true", "reward_model.nnodes=1", "reward_model.n_gpus_per_node=1"]
    resolved = compile_preset("ppo_reward_model.yaml", served + (pool if own_pool else []))
    assert resolved.roles.served_reward_model is not None
    events: list[tuple[str, ...]] = []
    build_trainer(resolved, tmp_path / "run", recording_factory(events), log=lambda line: None)
    served_submit = events.index(("reward_model", "submit", "init_model"))
    actor_wait = events.index(("actor_rollout_ref", "collect", "init_model"))
    engine = events.index(("actor_rollout_ref", "call", "start_rollout"))
    if own_pool:
        assert served_submit < actor_wait
    else:  # its free-memory check must see every resident of the actor's GPU, the asleep rollout engine's too
        assert served_submit > engine


def test_every_worker_group_of_the_plan_is_spawned_by_name_when_ray_is_up():
    import importlib

    from engine.launch import worker_groups

    def named(preset: str, *overrides: str) -> list[tuple[str, str, int]]:
        return [(spec[1], role, ranks) for spec, role, ranks, _ in worker_groups(compile_preset(preset, list(overrides)))]

    assert named("quickstart.yaml") == [("ActorRolloutRefWorker", "actor_rollout_ref", 2)]
    assert named("ppo_reward_model.yaml") == [("ActorRolloutRefWorker", "actor_rollout_ref", 2),
                                              ("CriticWorker", "critic", 2), ("RewardModelWorker", "reward_model", 2)]
    assert named("quickstart_offpolicy.yaml") == [("ActorRolloutRefWorker", "actor_rollout_ref", 1),
                                                  ("RolloutWorker", "rollout", 1)]
    # vLLM is imported ahead by the groups that start it: the colocated actor's, or the rollout pool's alone.
    preloads = {role: preload for _, role, _, preload in worker_groups(compile_preset("quickstart_offpolicy.yaml", [
        "trainer.device=cuda", "actor_rollout_ref.rollout.name=vllm"]))}
    assert preloads == {"actor_rollout_ref": (), "rollout": ("vllm",)}
    assert [g[3] for g in worker_groups(compile_preset("quickstart.yaml", ["trainer.device=cuda",
                                                                           "actor_rollout_ref.rollout.name=vllm"]))] == [("vllm",)]
    assert [g[3] for g in worker_groups(compile_preset("quickstart.yaml"))] == [()]  # HF generate: nothing ahead
    # Each name is the class build_trainer asks the factory for, with that ROLE: the spawned group is the one used.
    for spec, role, _, _ in worker_groups(compile_preset("ppo_reward_model.yaml")):
        cls = getattr(importlib.import_module(spec[0]), spec[1])
        assert cls.ROLE == role
