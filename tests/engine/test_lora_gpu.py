"""On a CUDA GPU with vLLM: LoRA training with the vLLM rollout (presets/quickstart_lora.yaml).

The actor trains peft adapters on its FSDP2 shard (bf16 frozen base, fp32 adapters); after each update
the worker folds them into the base weights and pushes those merged weights into vLLM under the base
model's names. If vLLM kept sampling from the base weights (or from a wrong merge), its sampling
log-probs would drift away from the actor's recomputed ones as the adapters move, and the
truncated-IS weights would leave 1. Skipped without a CUDA device, vLLM or peft (CI has none of the
first two). Run on the GPU machine with `python -m pytest -q -m gpu tests/engine/test_lora_gpu.py`.
"""

from __future__ import annotations

import importlib.util

import pytest
from launching import assert_learns, launch_preset, read_metrics

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none; run on the GPU machine)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (pip install 'rlconf[vllm]')"),
    pytest.mark.skipif(importlib.util.find_spec("peft") is None, reason="needs peft (pip install 'rlconf[lora]')"),
]

# vLLM's attention kernels need a head size of 64; an untied LM head so its adapter merges like any layer's.
SMALL_UNTIED = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512,
                    max_position_embeddings=1024, tie_word_embeddings=False)


@pytest.fixture(scope="module")
def lora_vllm_run(tmp_path_factory):
    from engine.models.tiny import build_tiny_model

    model_dir = build_tiny_model(tmp_path_factory.mktemp("small_qwen2_untied"), arch="qwen2", **SMALL_UNTIED)
    return launch_preset(tmp_path_factory, "lora_vllm", "quickstart_lora.yaml", [
        "trainer.device=cuda", "trainer.n_gpus_per_node=1", f"actor_rollout_ref.model.path={model_dir}",
        "actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
        "actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.gpu_memory_utilization=0.3",
        "algorithm.rollout_correction.rollout_is=token"])


def test_lora_with_vllm_rollout_runs_every_step_and_vllm_samples_from_the_merged_adapters(lora_vllm_run):
    resolved, run_dir, code = lora_vllm_run
    assert code == 0
    assert resolved.config.actor_rollout_ref.model.lora_rank > 0
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, resolved.config.trainer.total_training_steps + 1))
    assert all("timing/rollout_load_weights" in m for m in metrics)
    # The policy moves (entropy falls) while vLLM and the actor keep describing the same policy.
    assert metrics[-1]["actor/entropy"] < metrics[0]["actor/entropy"] - 0.1, [m["actor/entropy"] for m in metrics]
    assert all(0.9 < m["rollout/is_weight_mean"] < 1.1 for m in metrics), [m["rollout/is_weight_mean"] for m in metrics]
    late = [m["rollout/log_prob_diff_mean"] for m in metrics[-5:]]
    assert max(late) < 0.05, late


def test_lora_with_vllm_rollout_learns_as_the_cpu_quickstart_does(lora_vllm_run):
    _, run_dir, code = lora_vllm_run
    assert code == 0
    assert_learns(read_metrics(run_dir))
