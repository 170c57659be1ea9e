"""model.use_liger reaches the models: the actor worker patches the actor and the reference, before
FSDP wraps them (engine/models/liger.py). Liger itself needs CUDA, so on CPU a spy stands in for
`apply_liger`; tests/engine/test_kernels_gpu.py runs the real kernels on a GPU."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PRESET = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"


def _plan(*overrides: str):
    from rlconf.compile import compile_plan

    result = compile_plan(PRESET, ["trainer.n_gpus_per_node=1", "actor_rollout_ref.actor.use_kl_loss=true",
                                   "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=4",
                                   *overrides])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


@pytest.mark.parametrize("use_liger", [True, False])
def test_the_worker_patches_the_actor_and_the_reference_before_fsdp_only_with_use_liger(
        tiny_model_dir, monkeypatch, use_liger):
    import engine.workers.roles.actor_rollout_ref as actor_module
    from engine.workers.cluster.device import join_process_group, set_rendezvous_env
    from engine.workers.cluster.failure import free_port

    patched = []

    def spy(model):
        # FSDP2's fully_shard swaps the class for an FSDP<...> subclass: not yet at patch time.
        patched.append(type(model).__name__)
        return 7

    monkeypatch.setattr(actor_module, "apply_liger", spy)
    set_rendezvous_env(0, 1, "127.0.0.1", free_port(), "127.0.0.1")
    join_process_group(torch.device("cpu"), 0, 1)
    monkeypatch.setattr(actor_module, "join_process_group", lambda *args: None)
    try:
        worker = actor_module.ActorRolloutRefWorker(_plan(f"actor_rollout_ref.model.use_liger={str(use_liger).lower()}"),
                                                    str(tiny_model_dir), 0, 1, total_training_steps=1,
                                                    pad_token_id=0, eos_token_id=1)
        worker.init_model()
        assert worker.ref is not None
        assert patched == (["Qwen2ForCausalLM", "Qwen2ForCausalLM"] if use_liger else [])
        assert worker.liger_modules == (14 if use_liger else 0)  # the two models' counts, summed
        assert type(worker.actor).__name__.startswith("FSDP")  # and wrapped after
    finally:
        torch.distributed.destroy_process_group()


def test_apply_liger_keeps_the_modeling_modules_classes_for_the_models_built_after(tiny_model_dir, monkeypatch):
    """liger-kernel swaps the modeling module's RMSNorm and MLP classes as well as the instance's modules;
    apply_liger puts the classes back so a model built later in the process (a colocated critic) is not
    patched unasked. A stand-in for liger's entry point does what liger 0.8 does to a Qwen2 model."""
    import sys
    import types

    from transformers.models.qwen2 import modeling_qwen2

    from engine.models.liger import apply_liger
    from engine.models.loading import load_causal_lm

    class LigerRMSNorm(torch.nn.Module):
        def __init__(self, *args, **kwargs):
            super().__init__()

    def patch_instance(model, **kwargs):
        modeling_qwen2.Qwen2RMSNorm = LigerRMSNorm  # liger's module-level swap, for models built later
        model.model.norm = LigerRMSNorm()

    fake = types.ModuleType("liger_kernel.transformers")
    fake._apply_liger_kernel_to_instance = patch_instance
    monkeypatch.setitem(sys.modules, "liger_kernel", types.ModuleType("liger_kernel"))
    monkeypatch.setitem(sys.modules, "liger_kernel.transformers", fake)
    monkeypatch.setattr(modeling_qwen2, "Qwen2RMSNorm", modeling_qwen2.Qwen2RMSNorm)  # restored if this fails
    original = modeling_qwen2.Qwen2RMSNorm
    model = load_causal_lm(tiny_model_dir)
    assert apply_liger(model) == 1  # the instance keeps its patched module
    assert modeling_qwen2.Qwen2RMSNorm is original
    assert type(load_causal_lm(tiny_model_dir).model.norm) is original
