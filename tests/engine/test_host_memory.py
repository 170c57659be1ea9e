"""rlconf/host_memory.py: what offloaded training states hold of the launching machine's memory, and the launch's
word on it (a warning above 3/4 of the host, a refusal above all of it)."""

from __future__ import annotations

from pathlib import Path

import pytest
from launching import PRESETS, compile_preset

from rlconf.host_memory import GIB, HostNeed, _replicas, host_memory_bytes, host_memory_note, host_need

ACTOR = "actor_rollout_ref.actor.fsdp_config"
SEVEN_B = ["trainer.device=cuda", "actor_rollout_ref.model.path=random://Qwen2.5-7B"]


def test_a_7b_actor_offloaded_on_one_gpu_holds_12_bytes_a_parameter_and_the_export_8():
    plan = compile_preset("quickstart.yaml", [*SEVEN_B, f"{ACTOR}.param_offload=true",
                                              f"{ACTOR}.optimizer_offload=true"])
    params = plan.model.num_params
    assert 7.0e9 < params < 8.0e9
    need = host_need(plan)
    assert need.training == {"actor parameters (param_offload)": 4 * params,
                             "actor Adam moments (optimizer_offload)": 8 * params}
    assert need.export == 4 * params + 4 * params  # the moments released; the full fp32 weights beside the copies
    # The H200 host of 2026-11-28 (125 GiB) held it, at 91-93 GiB used while training: no word.
    assert host_memory_note(need, 125 * GIB) is None
    line, refuse = host_memory_note(need, 100 * GIB)
    assert not refuse and f"{12 * params / GIB:.1f} GiB" in line and "Ray stops a worker above 95%" in line
    line, refuse = host_memory_note(need, 64 * GIB)
    assert refuse and "more than it has" in line


def test_without_offload_nothing_is_held_and_nothing_is_said():
    plan = compile_preset("quickstart.yaml", SEVEN_B)
    need = host_need(plan)
    assert need.training == {} and host_memory_note(need, 1 * GIB) is None


def test_the_reference_offloads_its_compute_dtype_copy_and_offload_policy_everything():
    plan = compile_preset("quickstart.yaml", [*SEVEN_B, "actor_rollout_ref.ref.fsdp_config.param_offload=true",
                                              "algorithm.use_kl_in_reward=true", f"{ACTOR}.offload_policy=true",
                                              "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
                                              "actor_rollout_ref.model.dtype=bfloat16"])
    params = plan.model.num_params
    need = host_need(plan)
    assert need.training["reference parameters (param_offload)"] == 2 * params  # bf16
    assert need.training["actor parameters, gradients and Adam moments (offload_policy)"] == 16 * params
    # The export: the parameters stay (the actor's fp32 under offload_policy, the reference's bf16), plus the gather.
    assert need.export == 4 * params + 2 * params + 4 * params


def test_each_fsdp_replica_holds_its_own_copy():
    assert _replicas(2, -1) == 1 and _replicas(4, 2) == 2 and _replicas(8, 8) == 1 and _replicas(1, 4) == 1


def test_the_machines_memory_comes_from_meminfo(tmp_path: Path):
    meminfo = tmp_path / "meminfo"
    meminfo.write_text("MemTotal:       131072000 kB\nMemFree:        1000 kB\n")
    assert host_memory_bytes(meminfo) == 131072000 * 1024
    assert host_memory_bytes(tmp_path / "absent") is None
    assert host_memory_note(HostNeed({"x": 1.0}, gathered=1.0, kept=0.0), None) is None


def test_a_local_launch_that_cannot_hold_its_offloaded_states_is_refused_before_ray(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    import engine.launch
    from rlconf.cli import app

    started: list[str] = []
    monkeypatch.setattr(engine.launch, "start_ray", lambda *a, **k: started.append("ray"))
    monkeypatch.setattr(engine.launch, "host_memory_bytes", lambda: 1024)  # a machine of 1 KiB
    result = CliRunner().invoke(app, ["launch", str(PRESETS / "quickstart.yaml"), f"{ACTOR}.param_offload=true",
                                      "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert "offloaded training states will hold" in result.output and "more than it has" in result.output
    assert "this machine lacks what it needs" in result.output and started == []
