"""A non-finite loss stops the run naming the step, role and tensor, and leaves the last good checkpoint latest."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launching import compile_preset, train_in_process  # noqa: E402


def test_nan_advantages_stop_the_run_at_that_step_and_nothing_is_saved_over_the_last_checkpoint(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import engine.controller.stages
    from engine.trainer import NonFiniteError

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("quickstart.yaml", ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=3",
                                                  "trainer.save_freq=1"])
    calls = []
    real = engine.controller.stages.compute_advantages

    def nan_in_step_2(*args, **kwargs):
        out = real(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:  # the second step's batch: as if a reward function returned NaN
            out = {name: torch.full_like(value, float("nan")) for name, value in out.items()}
        return out

    monkeypatch.setattr(engine.controller.stages, "compute_advantages", nan_in_step_2)
    run_dir = tmp_path / "run"
    with pytest.raises(NonFiniteError, match=r"^step 2: actor/pg_loss is nan \(non-finite\); stopping the run$"):
        train_in_process(resolved, run_dir, checkpoints=True)
    checkpoints = run_dir / "checkpoints"
    assert (checkpoints / "latest_checkpointed_iteration.txt").read_text() == "1\n"
    assert sorted(p.name for p in checkpoints.iterdir() if p.name.startswith("global_step_")) == ["global_step_1"]
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [1, 2]  # step 2's metrics are written: they show the NaN
