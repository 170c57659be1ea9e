"""A validation's rollout backend seconds reach no step's figures, in the colocated actor worker (the rollout
pool's worker: tests/engine/test_partial_rollout.py). vLLM's backend adds its seconds up until asked
(engine.rollout.vllm: _add_seconds); the HF backend here is given the same habit, one second a generate call."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PRESET = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"


def summing_as_vllm(backend, monkeypatch) -> dict[str, float]:
    """`backend`'s generate adds one second to its timings and timings() hands them over and resets, as vLLM's
    backend does; returns the timings dict, for a test to add what else the backend timed."""
    backend_generate, seconds = backend.generate, {}

    def generate(prompts, sampling, **kwargs):
        seconds["generate_in_worker"] = seconds.get("generate_in_worker", 0.0) + 1.0
        return backend_generate(prompts, sampling, **kwargs)

    def timings() -> dict[str, float]:
        out = dict(seconds)
        seconds.clear()
        return out

    monkeypatch.setattr(backend, "generate", generate)
    monkeypatch.setattr(backend, "timings", timings)
    return seconds


def test_the_colocated_workers_validation_seconds_go_into_no_steps_rollout_timings(tiny_model_dir, monkeypatch):
    import engine.workers.roles.actor_rollout_ref as actor_module
    from engine.workers.cluster.device import join_process_group, set_rendezvous_env
    from engine.workers.cluster.failure import free_port
    from rlconf.compile import compile_plan

    result = compile_plan(PRESET, ["trainer.n_gpus_per_node=1", "data.max_response_length=4"])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    set_rendezvous_env(0, 1, "127.0.0.1", free_port(), "127.0.0.1")
    join_process_group(torch.device("cpu"), 0, 1)
    monkeypatch.setattr(actor_module, "join_process_group", lambda *args: None)
    try:
        worker = actor_module.ActorRolloutRefWorker(result.resolved, str(tiny_model_dir), 0, 1, total_training_steps=1,
                                                    pad_token_id=0, eos_token_id=1)
        worker.init_model()
        seconds = summing_as_vllm(worker.rollout, monkeypatch)
        prompts = {"input_ids": torch.full((2, 3), 20), "attention_mask": torch.ones(2, 3, dtype=torch.long)}
        worker.generate(prompts)
        worker.rollout_timings()  # the step's figures, at its end
        seconds["load_weights"] = 0.5  # timed after them and before the validation: the next step's
        worker.generate_for_validation(prompts)
        worker.generate(prompts)  # the next step
        figures = worker.rollout_timings()
        assert figures["generate_in_worker"] == 1.0 and figures["load_weights"] == 0.5
        worker.generate(prompts)
        assert "load_weights" not in worker.rollout_timings()  # carried once
    finally:
        torch.distributed.destroy_process_group()
