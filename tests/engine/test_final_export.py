"""The end of a run (engine.launch → Trainer.export_final): every trained group releases its optimizer before the
actor's HF export gathers the full weights, in the memory the moments held."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

pytest.importorskip("torch")


def test_every_group_releases_its_optimizer_before_the_actor_is_exported(monkeypatch, tmp_path: Path):
    import engine.trainer
    from engine.trainer import Trainer

    calls: list[tuple] = []

    class Group:
        def __init__(self, role: str) -> None:
            self.role = role

        def call_all(self, method: str, *args) -> list:
            calls.append((self.role, method))
            return []

    actor, critic = Group("actor"), Group("critic")
    monkeypatch.setattr(engine.trainer, "export_hf_model",
                        lambda group, name, tokenizer, out_dir: calls.append((group.role, f"export {name}")) or out_dir)
    trainer = SimpleNamespace(_worker_groups=lambda: [actor, critic], group=actor, tokenizer=None)
    assert Trainer.export_final(trainer, tmp_path / "hf_actor") == tmp_path / "hf_actor"
    assert calls == [("actor", "release_optimizer"), ("critic", "release_optimizer"), ("actor", "export actor")]
