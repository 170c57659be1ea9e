"""On a CUDA GPU: NCCL process groups, FSDP2 with bf16 compute over fp32 master weights, HF rollout in
bf16, Ray placement of GPU workers (a colocated critic shares the actor's GPU), checkpoints.

Skipped without a CUDA device (CI has none). Run on the lent GPU machine with
`python -m pytest -q -m gpu tests/engine/test_gpu_e2e.py`; docs/benchmarks.md records the runs.
"""

from __future__ import annotations


import pytest
from launching import assert_learns, compile_preset, launch_preset, read_metrics

torch = pytest.importorskip("torch")
pytest.importorskip("ray")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none; run on the GPU machine)"),
]

ON_ONE_GPU = ["trainer.device=cuda", "trainer.n_gpus_per_node=1",
              "actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16"]


@pytest.fixture(scope="module")
def grpo_gpu_run(tmp_path_factory):
    return launch_preset(tmp_path_factory, "quickstart_gpu", "quickstart.yaml", ON_ONE_GPU)[1:]


@pytest.fixture(scope="module")
def ppo_gpu_run(tmp_path_factory):
    return launch_preset(tmp_path_factory, "ppo_gpu", "quickstart_ppo.yaml", ON_ONE_GPU + ["trainer.total_training_steps=6"])[1:]


def test_in_process_worker_on_cuda_uses_nccl_fp32_master_weights_and_bf16_compute(tiny_model_dir):
    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker
    from engine.workers.cluster.local import LocalWorkerGroup

    resolved = compile_preset("quickstart.yaml", ON_ONE_GPU)
    group = LocalWorkerGroup(ActorRolloutRefWorker, "actor_rollout_ref", 1, resolved=resolved,
                             model_path=str(tiny_model_dir), total_training_steps=1, pad_token_id=0, eos_token_id=1)
    try:
        (info,) = group.call_all("init_model")
        assert (info["device"], info["backend"]) == ("cuda:0", "nccl")
        assert (info["param_dtype"], info["compute_dtype"], info["rollout_dtype"]) == (
            "torch.float32", "torch.bfloat16", "torch.bfloat16")
        prompts = {"input_ids": torch.randint(10, 200, (4, 8)), "attention_mask": torch.ones(4, 8, dtype=torch.long)}
        (rows,) = group.call_sharded("generate", [prompts])
        assert rows["responses"].device.type == "cpu"  # results travel back to the controller on the CPU
        (log_probs,) = group.call_sharded("compute_log_prob", [rows])
        assert log_probs["old_log_probs"].shape == rows["responses"].shape
        assert bool(torch.isfinite(log_probs["old_log_probs"]).all())
    finally:
        group.kill()


def test_grpo_quickstart_on_one_gpu_runs_every_step_and_learns(grpo_gpu_run):
    run_dir, code = grpo_gpu_run
    assert code == 0
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 41))
    assert_learns(metrics)


def test_gpu_run_reports_cuda_peak_memory_and_writes_checkpoints_and_the_hf_export(grpo_gpu_run):
    run_dir, _ = grpo_gpu_run
    metrics = read_metrics(run_dir)
    peak = max(m["memory/actor_peak_gb"] for m in metrics)
    assert 0 < peak < torch.cuda.get_device_properties(0).total_memory / 2**30
    # quickstart: save_freq 20 of 40 steps
    assert (run_dir / "checkpoints" / "latest_checkpointed_iteration.txt").read_text() == "40\n"
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(run_dir / "hf_actor")
    assert sum(p.numel() for p in model.parameters()) > 0


def test_ppo_with_a_critic_sharing_the_actors_gpu_runs_every_step(ppo_gpu_run):
    run_dir, code = ppo_gpu_run
    assert code == 0
    metrics = read_metrics(run_dir)
    assert [m["step"] for m in metrics] == list(range(1, 7))
    assert all(m["memory/critic_peak_gb"] > 0 for m in metrics)
    assert all(torch.isfinite(torch.tensor(m["critic/vf_loss"])) for m in metrics)
