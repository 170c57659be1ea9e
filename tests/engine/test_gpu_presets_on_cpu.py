"""The memory-lean and long-context GPU presets launch on CPU, their knobs kept, the model made tiny.

`presets/memory_lean.yaml` (param/optimizer offload, activation offload, token budgets) and `presets/long_context_ulysses.yaml` (Ulysses sp 4,
packing, dynamic batch size, optimizer and reference offload) are 7B plans for 8 GPUs. Only what
cannot run on a CPU is overridden: the model and the data (tiny, synthetic), the rollout (HF
generate, tp 1), the sizes (world of 2 or 4 processes, a batch of 4 prompts); every speed and
memory knob of the preset stays as written. Two steps and a checkpoint must complete: the same
code paths the GPU runs take, minus CUDA.
"""

from __future__ import annotations

import pytest

from tests.engine.launching import assert_ran_and_saved, launch_preset

pytestmark = pytest.mark.slow

ARR = "actor_rollout_ref"
TINY_ON_CPU = (
    "data.train_files=synthetic://echo?size=256&seed=0", "data.val_files=synthetic://echo?size=16&seed=1",
    "data.max_prompt_length=32", "data.max_response_length=8", "data.train_batch_size=4",
    f"{ARR}.model.path=tiny://qwen2", f"{ARR}.model.dtype=float32", f"{ARR}.rollout.name=hf",
    f"{ARR}.rollout.tensor_model_parallel_size=1", f"{ARR}.rollout.dtype=float32", f"{ARR}.rollout.n=4",
    f"{ARR}.actor.ppo_mini_batch_size=4", "trainer.device=cpu", "trainer.total_training_steps=2",
    "trainer.save_freq=2", "trainer.test_freq=-1", "trainer.logger=[console]",
)


@pytest.mark.parametrize(("preset", "processes"), [("memory_lean.yaml", 2), ("long_context_ulysses.yaml", 4)])
def test_gpu_preset_launches_on_cpu_with_its_knobs(tmp_path_factory, ray_address, preset, processes):
    resolved, run_dir, code = launch_preset(tmp_path_factory, preset.removesuffix(".yaml"), preset,
                                            [*TINY_ON_CPU, f"trainer.n_gpus_per_node={processes}"], address=ray_address)
    actor = resolved.config.actor_rollout_ref.actor
    if preset == "memory_lean.yaml":  # the knobs the preset exists for are still on after the overrides
        assert actor.fsdp_config.param_offload and actor.fsdp_config.optimizer_offload
        assert resolved.config.actor_rollout_ref.model.enable_activation_offload
    else:
        assert resolved.roles.actor.sp_size == 4 and actor.use_dynamic_bsz
        assert resolved.config.actor_rollout_ref.ref.fsdp_config.param_offload
    assert_ran_and_saved(run_dir, code, steps=2)
