"""On two CUDA GPUs of one host: FSDP over 2 ranks with NCCL, Ray placement-group bundles one GPU each,
vLLM rollout with tensor parallelism 2 (one replica over both ranks) and 1 (two replicas); the
memory-lean and long-context presets launched as written but for size (their 7B model, 8 GPUs and
data made small; long_context_ulysses's sp 4 made 2).

Skipped with fewer than two GPUs (CI has none). Run on the lent 2-GPU machine with
`python -m pytest -q -m gpu tests/engine/test_multi_gpu.py`; docs/benchmarks.md records the runs.
"""

from __future__ import annotations

import importlib.util
import json

import pytest
from launching import assert_learns, assert_ran_and_saved, launch_preset, read_metrics

torch = pytest.importorskip("torch")
pytest.importorskip("ray")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                       reason="needs two CUDA GPUs on one host (CI has none; run on the 2-GPU machine)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (pip install 'rlconf[vllm]')"),
]

# vLLM's attention kernels need a head size of 64 or more (the CPU tiny model's is 16).
SMALL_SHAPE = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512,
                   max_position_embeddings=1024)
ON_TWO_GPUS_VLLM = ["trainer.device=cuda", "trainer.n_gpus_per_node=2", "actor_rollout_ref.model.dtype=bfloat16",
                    "actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.rollout.name=vllm",
                    "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]


@pytest.fixture(scope="module")
def small_model_dir(tmp_path_factory):
    from engine.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("small_qwen2"), arch="qwen2", **SMALL_SHAPE)


def _learns(metrics: list[dict]) -> None:
    assert [m["step"] for m in metrics] == list(range(1, 41))
    assert_learns(metrics)


def _actor_gpus(run_dir) -> list[list[str]]:
    """The GPU ids Ray gave each actor rank (from the run's workers.json)."""
    return [w["gpu_ids"] for w in json.loads((run_dir / "workers.json").read_text())["actor_rollout_ref"]]


@pytest.mark.parametrize("tp,packed", [(2, True), (1, False)], ids=["tp2_packed", "tp1_two_replicas"])
def test_grpo_on_two_gpus_with_nccl_fsdp_and_vllm_learns(tmp_path_factory, small_model_dir, tp, packed):
    resolved, run_dir, code = launch_preset(
        tmp_path_factory, f"two_gpus_tp{tp}", "quickstart.yaml",
        ON_TWO_GPUS_VLLM + [f"actor_rollout_ref.model.path={small_model_dir}",
                            f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp}",
                            f"actor_rollout_ref.model.use_remove_padding={str(packed).lower()}"])
    assert code == 0
    assert resolved.roles.rollout.replicas == 2 // tp
    gpus = _actor_gpus(run_dir)
    assert len(gpus) == 2 and all(len(ids) == 1 for ids in gpus) and gpus[0] != gpus[1], gpus
    metrics = read_metrics(run_dir)
    _learns(metrics)
    # vLLM's sampling log-probs and the actor's recomputation describe nearly the same policy.
    assert all(m["rollout/log_prob_diff_mean"] < 0.05 for m in metrics)


ARR = "actor_rollout_ref"
# What makes a 7B, 8-GPU preset fit two GPUs and a test's time: model, data, sizes, step count.
PRESET_ON_TWO_GPUS = [
    "trainer.device=cuda", "trainer.n_gpus_per_node=2", f"{ARR}.model.dtype=bfloat16", f"{ARR}.rollout.dtype=bfloat16",
    "data.train_files=synthetic://echo?size=256&seed=0", "data.val_files=synthetic://echo?size=16&seed=1",
    "data.max_prompt_length=32", "data.max_response_length=32", "data.train_batch_size=8", f"{ARR}.rollout.n=4",
    f"{ARR}.actor.ppo_mini_batch_size=4", f"{ARR}.rollout.gpu_memory_utilization=0.3",
    "trainer.total_training_steps=3", "trainer.save_freq=3", "trainer.test_freq=-1", "trainer.logger=[console]",
]


def preset_overrides(preset: str, model_dir) -> list[str]:
    return [*PRESET_ON_TWO_GPUS, f"{ARR}.model.path={model_dir}",
            *([f"{ARR}.actor.ulysses_sequence_parallel_size=2"] if preset == "long_context_ulysses.yaml" else [])]


@pytest.mark.parametrize("preset", ["memory_lean.yaml", "long_context_ulysses.yaml"])
def test_gpu_presets_launch_on_two_gpus_with_their_knobs(tmp_path_factory, small_model_dir, preset):
    """memory_lean: param and optimizer offload, activation offload, the Triton loss head (use_torch_compile),
    token budgets, vLLM at tp 2; long_context_ulysses: Ulysses (sp 2 here) with packing,
    dynamic batch size, optimizer and reference offload, vLLM at tp 2. Three steps and a checkpoint."""
    resolved, run_dir, code = launch_preset(tmp_path_factory, preset.removesuffix(".yaml"), preset,
                                            preset_overrides(preset, small_model_dir))
    actor = resolved.config.actor_rollout_ref.actor
    if preset == "memory_lean.yaml":
        assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
        assert resolved.config.actor_rollout_ref.model.enable_activation_offload
        assert resolved.config.actor_rollout_ref.actor.use_torch_compile  # the Triton loss head on CUDA
    else:
        assert resolved.roles.actor.sp_size == 2 and actor.use_dynamic_bsz and actor.fsdp_config.optimizer_offload
    assert resolved.roles.rollout.tensor_parallel_size == 2
    assert_ran_and_saved(run_dir, code, steps=3)
