"""What `rlconf launch` says about the machine it runs on: which fix a refusal needs, the GPU the
memory checks use, the start-up phases, and no warnings in the CPU quickstart's output."""

from __future__ import annotations

import importlib.util
import os
import time
from pathlib import Path

import pytest
from launching import PRESETS, compile_preset

pytest.importorskip("torch")


def _launch(args: list[str], monkeypatch: pytest.MonkeyPatch, started: list[str]) -> tuple[int, str]:
    """`rlconf launch ARGS` in-process, with Ray and the engine's run stubbed out: (exit code, output)."""
    from typer.testing import CliRunner

    import engine.launch
    from rlconf.cli import app

    monkeypatch.setattr(engine.launch, "start_ray", lambda *a, **k: started.append("ray"))
    result = CliRunner().invoke(app, ["launch", *args])
    return result.exit_code, result.output


def test_the_closing_line_names_the_kind_of_fix():
    from engine.problems import MachineShortfall, closing_line

    engine_problem, machine_problem = "x is not implemented", MachineShortfall("y is not installed")
    assert "this engine does not run it yet" in closing_line([engine_problem])
    assert "this machine lacks what it needs" in closing_line([machine_problem])
    both = closing_line([machine_problem, engine_problem])
    assert "does not run part of it" in both and "lacks what the rest needs" in both


def test_missing_packages_and_devices_are_the_machines_problems_and_refused_features_the_engines():
    from engine.capabilities import rollout_problems, triton_head_problems, unsupported_features
    from engine.launch import local_gpu_shortage
    from engine.loggers import logger_problems
    from engine.models.liger import liger_problems
    from engine.problems import MachineShortfall

    gpu_plan = compile_preset("grpo_7b_8gpu.yaml")
    machine = [*rollout_problems(gpu_plan, vllm_found=lambda: False),
               *liger_problems(True, "cuda", liger_found=lambda: False),
               *triton_head_problems("triton", "cuda", triton_found=lambda: False, use_torch_compile=False,
                                     use_fused_kernels=False),
               *logger_problems(["wandb"] if importlib.util.find_spec("wandb") is None else [])]
    assert machine and all(isinstance(p, MachineShortfall) for p in machine)
    shortage = local_gpu_shortage(gpu_plan)
    assert shortage is None or isinstance(shortage, MachineShortfall)
    # Features the engine does not run are the plan's to change, whatever the machine has.
    refused = unsupported_features(compile_preset("quickstart.yaml", [
        "algorithm.adv_estimator=tir_optimal_token_baseline", "algorithm.rollout_correction.bypass_mode=true"]))
    assert refused and not any(isinstance(p, MachineShortfall) for p in refused)
    assert [p for p in liger_problems(True, "cpu", liger_found=lambda: True)
            if isinstance(p, MachineShortfall)] == []  # Liger on CPU: the plan's device, not a package


def test_a_gpu_preset_on_a_cpu_machine_says_the_machine_lacks_what_it_needs(monkeypatch, tmp_path):
    import engine.capabilities
    import engine.launch

    monkeypatch.setattr(engine.capabilities, "vllm_importable", lambda: False)
    monkeypatch.setattr("rlconf.device.local_gpu", lambda: None)
    monkeypatch.setattr(engine.launch, "local_gpu_shortage", lambda resolved: engine.launch.MachineShortfall(
        "trainer.device=cuda, but this machine has no CUDA device"))
    started: list[str] = []
    code, output = _launch([str(PRESETS / "grpo_7b_8gpu.yaml"), "--run-dir", str(tmp_path / "run")], monkeypatch,
                           started)
    assert code == 1, output
    assert "vLLM is not installed" in output and "no CUDA device" in output
    assert "this machine lacks what it needs" in output
    assert "this engine does not run it" not in output and "cannot run it yet" not in output
    assert started == []


def test_a_refused_feature_says_the_engine_does_not_run_it(monkeypatch, tmp_path):
    started: list[str] = []
    code, output = _launch([str(PRESETS / "quickstart.yaml"), "algorithm.adv_estimator=tir_optimal_token_baseline",
                            "algorithm.rollout_correction.bypass_mode=true", "--run-dir", str(tmp_path / "run")],
                           monkeypatch, started)
    assert code == 1, output
    assert "this engine does not run it yet" in output and "lacks" not in output
    assert started == []


def test_the_gpu_memory_check_uses_the_devices_memory_and_says_so():
    from engine.launch import device_memory_override
    from rlconf.device import LocalGpu

    gpu_plan = compile_preset("quickstart.yaml", ["trainer.device=cuda"])
    override, note = device_memory_override(gpu_plan, LocalGpu("Stand-in GPU", 79.6))
    assert override == "estimate.gpu_memory_gib=79.6"
    assert note == "memory checks use this machine's GPU: Stand-in GPU, 79.6 GiB (the plan's estimate.gpu_memory_gib says 24)"
    # The plan's number already matches: no "says" aside, but the device is still named.
    _, note = device_memory_override(compile_preset("quickstart.yaml", ["trainer.device=cuda",
                                                                        "estimate.gpu_memory_gib=80"]),
                                     LocalGpu("Stand-in GPU", 79.6))
    assert note == "memory checks use this machine's GPU: Stand-in GPU, 79.6 GiB"
    assert device_memory_override(compile_preset("quickstart.yaml"), LocalGpu("Stand-in GPU", 79.6)) == (None, None)
    assert device_memory_override(gpu_plan, None) == (None, None)


# A 0.5B GPU workload on the CPU quickstart: 37.4 GiB per GPU by the estimate, over the preset's 24.
GPU_WORKLOAD = ["trainer.device=cuda", "trainer.n_gpus_per_node=1", "actor_rollout_ref.model.path=random://Qwen2.5-0.5B",
                "actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
                "data.max_response_length=512", "actor_rollout_ref.actor.ppo_mini_batch_size=8",
                "data.train_batch_size=8", "actor_rollout_ref.rollout.n=8",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=32"]


@pytest.mark.parametrize("memory_gib, over", [(79.6, False), (10.0, True)])
def test_a_gpu_launch_checks_memory_against_the_stand_in_device(monkeypatch, tmp_path, memory_gib, over):
    import engine.launch
    from rlconf.compile import compile_plan
    from rlconf.device import LocalGpu

    # The workload's estimate is over the preset's 24 GiB: the warning the plan's number gives.
    assert any(d.code == "RL609" for d in compile_plan(PRESETS / "quickstart.yaml", GPU_WORKLOAD).warnings)
    monkeypatch.setattr("rlconf.device.local_gpu", lambda: LocalGpu("Stand-in GPU", memory_gib))
    launched = []
    monkeypatch.setattr(engine.launch, "run_launch", lambda resolved, **kwargs: launched.append(resolved) or 0)
    code, output = _launch([str(PRESETS / "quickstart.yaml"), *GPU_WORKLOAD, "--run-dir", str(tmp_path / "run")],
                           monkeypatch, [])
    assert code == 0, output
    assert f"memory checks use this machine's GPU: Stand-in GPU, {memory_gib:g} GiB (the plan's estimate.gpu_memory_gib " \
           "says 24)" in output
    assert "over the 24 GiB" not in output
    assert ("RL609" in output and f"over the {memory_gib:g} GiB" in output) == over
    assert launched[0].config.estimate.gpu_memory_gib == memory_gib  # plan.resolved.json records the device's


def test_local_gpu_reads_nvidia_smi_and_takes_the_smallest_gpu(monkeypatch, tmp_path):
    from rlconf.device import LocalGpu, local_gpu

    smi = tmp_path / "nvidia-smi"
    smi.write_text("#!/bin/sh\nprintf 'NVIDIA H100 80GB HBM3, 81559\\nNVIDIA H100 80GB HBM3, 81000\\n'\n")
    smi.chmod(0o755)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    assert local_gpu() == LocalGpu("NVIDIA H100 80GB HBM3", 81000 / 1024)
    smi.write_text("#!/bin/sh\nexit 9\n")  # no driver: nvidia-smi fails
    assert local_gpu() is None


def test_startup_phases_are_timed_and_announced_as_they_begin():
    from engine.startup import StartupClock

    lines: list[str] = []
    clock = StartupClock(lines.append, started=time.perf_counter() - 2.0)  # the command began 2 s ago
    clock.so_far("plan")
    assert 2.0 <= clock.seconds["plan"] < 10.0 and lines == []  # timed, not announced: it is over
    with clock.phase("ray", "starting a local Ray cluster"):
        assert lines == ["start-up: starting a local Ray cluster …"]  # before the phase's work, not after
    with clock.phase("actor_load", "loading the actor model"):
        pass
    metrics = clock.metrics()
    assert set(metrics) == {"timing/startup_plan", "timing/startup_ray", "timing/startup_actor_load",
                            "timing/startup_total"}
    assert metrics["timing/startup_total"] >= sum(metrics[f"timing/startup_{name}"] for name in clock.seconds)
    assert clock.summary(metrics, 1.5).startswith("start-up: ")
    assert "ray " in clock.summary(metrics, 1.5) and "the step 1.5s" in clock.summary(metrics, 1.5)


def test_the_actor_workers_pieces_go_into_the_actor_load_phase():
    from engine.startup import StartupClock, last_ranks_pieces

    clock = StartupClock(started=time.perf_counter())
    with clock.phase("actor_load", "loading the actor model"):
        time.sleep(0.01)
    # Two ranks' own accounts (constructed 3 s and 2 s after the driver asked for them, at 100.0). Rank 0 was
    # slowest to start, rank 1 at the process group, but rank 1's pieces add up to more (3.7 s against 3.5 s):
    # it held the phase up, and its pieces are the ones reported, none of rank 0's.
    clock.actor_pieces = last_ranks_pieces([{"startup_s": {"constructed_at": 103.0, "process_group": 0.5}},
                                            {"startup_s": {"constructed_at": 102.0, "process_group": 0.7,
                                                           "model_load": 1.0}},
                                            {"rank": 2}], created_at=100.0)
    metrics = clock.metrics()
    assert metrics["timing/startup_actor_worker_start"] == 2.0 and metrics["timing/startup_actor_process_group"] == 0.7
    assert metrics["timing/startup_actor_model_load"] == 1.0 and "timing/startup_actor_build" not in metrics
    line = clock.summary(metrics, 1.0)
    assert "actor load 0.0s (worker start 2.0s, process group 0.7s, weights 1.0s), the step 1.0s" in line
    assert last_ranks_pieces([{"rank": 0}], created_at=100.0) == {}


@pytest.mark.slow
def test_the_quickstarts_first_step_carries_the_startup_phases(quickstart_run):
    from launching import read_metrics

    _, run_dir, code = quickstart_run
    assert code == 0
    first, *rest = read_metrics(run_dir)
    for phase in ("plan", "ray", "model_files", "data", "actor_load", "total"):
        assert first[f"timing/startup_{phase}"] >= 0
    assert first["timing/startup_total"] > first["timing/startup_actor_load"]
    # The workers' own pieces of the actor's load fit inside it: they are one rank's (engine.startup
    # last_ranks_pieces), each measured inside the phase. The worker's clock is time.time(), the phase's
    # perf_counter: a hundredth of a second apart at most.
    pieces = ("worker_start", "process_group", "model_load", "build")
    assert all(0 < first[f"timing/startup_actor_{piece}"] < first["timing/startup_actor_load"] for piece in pieces)
    assert sum(first[f"timing/startup_actor_{piece}"] for piece in pieces) < first["timing/startup_actor_load"] + 0.01
    assert not any(key.startswith("timing/startup_") for row in rest for key in row)


@pytest.mark.slow
def test_the_readme_quickstart_prints_no_warning(quickstart_cli_run):
    """README's first command (a few steps of it; the session's launch, tests/engine/conftest.py): a
    FutureWarning or DeprecationWarning from any process, ours or one our calls trigger in torch /
    transformers, fails this test."""
    run = quickstart_cli_run
    assert run.returncode == 0, run.output
    warnings = [line for line in run.output.splitlines() if "Warning" in line]
    assert warnings == [], "\n".join(warnings)
    assert "start-up: starting a local Ray cluster" in run.output and "start-up: step 1 begins" in run.output


def test_a_missing_data_file_ends_the_launch_with_the_controllers_message_and_error_log(tmp_path):
    import subprocess
    import sys

    run_dir = tmp_path / "run"
    proc = subprocess.run([sys.executable, "-m", "rlconf", "launch", "presets/quickstart.yaml",
                           f"data.train_files={tmp_path / 'missing.parquet'}", "--run-dir", str(run_dir)],
                          capture_output=True, text=True, timeout=300, cwd=Path(__file__).resolve().parents[2])
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert "controller failed" in proc.stderr and "missing.parquet" in proc.stderr
    assert "Traceback" not in proc.stderr and (run_dir / "error.log").is_file()
