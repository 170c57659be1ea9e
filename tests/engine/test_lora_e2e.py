"""End to end: `rlconf launch presets/quickstart_lora.yaml` trains GRPO with LoRA adapters on CPU, 2 Ray workers.

The same learning criterion as the full fine-tuning quickstart (tests/engine/test_grpo_e2e.py): the
mean reward of the last 5 steps is at least twice the first 5 steps' AND at least 0.1 (a random
policy scores about 0.01). Measured on 2 cores, 2026-11-25 (deterministic for a seed), first 5 ->
last 5 steps: 0.012 -> 0.257 (the preset's seeds), 0.008 -> 0.251, 0.012 -> 0.202, 0.007 -> 0.158
(trainer.seed = data.seed = 1, 2, 3). With lr 0.005 instead of the preset's 0.003: 0.012 -> 0.259,
0.008 -> 0.062 (seed 1 fell from 0.27 to 0 after step 26), 0.012 -> 0.233.

The quickstart runs once per module, about 40 s on 2 cores (the full quickstart: about 30 s); the
resume test adds a second launch of 2 steps, about 27 s. The tests read what the runs left.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from launching import assert_learns, launch_preset, read_metrics

# Metrics that measure wall time or memory differ between any two runs (as in test_checkpoint_resume.py).
UNTIMED = ("timing/", "perf/tokens_per_second", "memory/")

pytest.importorskip("peft")


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory, ray_address: str) -> tuple[object, Path, int]:
    return launch_preset(tmp_path_factory, "quickstart_lora", "quickstart_lora.yaml", address=ray_address)


@pytest.fixture(scope="module")
def resumed_run(lora_run, tmp_path_factory: pytest.TempPathFactory, ray_address: str) -> tuple[Path, int]:
    """A second launch in a new run directory from the first run's step-20 checkpoint, for 2 steps."""
    _, run_dir, code = lora_run
    assert code == 0
    step_20 = run_dir / "checkpoints" / "global_step_20"
    _, resumed_dir, code = launch_preset(tmp_path_factory, "quickstart_lora_resumed", "quickstart_lora.yaml", [
        "trainer.resume_mode=resume_path", f"trainer.resume_from_path={step_20}", "trainer.total_training_steps=22"],
        address=ray_address)
    return resumed_dir, code


def _untimed(metrics: dict) -> dict:
    return {k: v for k, v in metrics.items() if not k.startswith(UNTIMED)}


@pytest.mark.slow
def test_lora_quickstart_mean_reward_of_last_5_steps_at_least_doubles_the_first_5(lora_run) -> None:
    resolved, run_dir, code = lora_run
    assert code == 0
    assert resolved.config.actor_rollout_ref.model.lora_rank > 0
    metrics = read_metrics(run_dir)
    assert len(metrics) == resolved.config.trainer.total_training_steps
    assert_learns(metrics)


@pytest.mark.slow
def test_lora_quickstart_exports_a_merged_plain_model_and_checkpoints_base_and_adapters(lora_run) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    _, run_dir, code = lora_run
    assert code == 0
    model, info = AutoModelForCausalLM.from_pretrained(run_dir / "hf_actor", dtype=torch.float32,
                                                       output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"], info
    assert not any("lora_" in name or "base_layer" in name for name in model.state_dict())
    checkpoints = sorted((run_dir / "checkpoints").glob("global_step_*/actor/.metadata"))
    assert checkpoints, "no actor checkpoint written"


@pytest.mark.slow
def test_a_run_resumed_from_a_lora_checkpoint_repeats_the_next_steps_exactly(lora_run, resumed_run) -> None:
    """Base, adapters, Adam's moments and every random stream come back: on CPU with fixed seeds, steps
    21 and 22 of the resumed run have the uninterrupted run's metrics, compared with ==."""
    _, run_dir, _ = lora_run
    resumed_dir, code = resumed_run
    assert code == 0
    uninterrupted = {m["step"]: _untimed(m) for m in read_metrics(run_dir)}
    resumed = {m["step"]: _untimed(m) for m in read_metrics(resumed_dir)}
    assert list(resumed) == [21, 22]
    assert resumed[21] == uninterrupted[21] and resumed[22] == uninterrupted[22]
    assert uninterrupted[21]["actor/grad_norm"] > 0  # the adapters were still moving after the checkpoint
