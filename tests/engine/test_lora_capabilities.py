"""A LoRA plan without peft installed is refused at launch, before Ray starts or any model loads.

No peft needed here: the check is what runs when peft is missing (stood in for by a patched
`peft_importable`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from launching import PRESETS, compile_preset

pytest.importorskip("torch")


def test_lora_without_peft_is_refused_naming_the_extra_and_with_peft_is_runnable() -> None:
    from engine.capabilities import lora_problems, unsupported_features

    plan = compile_preset("quickstart_lora.yaml")
    (problem,) = lora_problems(plan, peft_found=lambda: False)
    assert "lora_rank=16" in problem and "pip install 'rlconf[lora]'" in problem
    assert lora_problems(plan, peft_found=lambda: True) == []
    assert lora_problems(compile_preset("quickstart.yaml"), peft_found=lambda: False) == []  # lora_rank 0
    pytest.importorskip("peft")
    assert unsupported_features(plan) == []


def test_lora_with_a_reference_on_other_ulysses_ranks_than_the_actor_is_refused() -> None:
    """The reference runs on the actor's model, whose attention is set up for the actor's sp size."""
    from engine.capabilities import lora_problems

    plan = compile_preset("quickstart_lora.yaml", ["actor_rollout_ref.actor.use_kl_loss=true",
                                                   "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
                                                   "actor_rollout_ref.ref.ulysses_sequence_parallel_size=2"])
    assert [p for p in lora_problems(plan, peft_found=lambda: True)] == [
        "with LoRA the reference log-probs come from the actor's own model (adapters off), which runs Ulysses over "
        "1 rank(s); set actor_rollout_ref.ref.ulysses_sequence_parallel_size=1 (it is 2)"]


def test_launch_of_a_lora_plan_without_peft_exits_1_before_ray_starts(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    from typer.testing import CliRunner

    import engine.capabilities
    import engine.launch
    from rlconf.cli import app

    started: list[str] = []
    monkeypatch.setattr(engine.capabilities, "peft_importable", lambda: False)
    monkeypatch.setattr(engine.launch, "start_ray", lambda *a, **k: started.append("ray"))
    monkeypatch.setattr(engine.launch, "build_trainer", lambda *a, **k: started.append("trainer"), raising=False)
    result = CliRunner().invoke(app, ["launch", str(PRESETS / "quickstart_lora.yaml"), "--run-dir", str(tmp_path / "run")])
    assert result.exit_code == 1, result.output
    assert "rlconf[lora]" in result.output and "not launching" in result.output
    assert started == [] and not (tmp_path / "run").exists()
