"""A CPU quickstart run with a policy loss mode and an advantage estimator that are not PPO/GRPO's defaults:
the plan's loss_mode and adv_estimator are what the worker and the trainer call, for every step."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from launching import compile_preset, train_in_process  # noqa: E402


def test_gspo_with_opo_trains_two_steps_through_the_registries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import engine.algos.policy_losses as policy_losses
    import engine.controller.advantages

    calls = {"gspo": 0, "opo": 0}

    def counted(name, table):
        real = table[name]

        def wrapper(*args, **kwargs):
            calls[name] += 1
            return real(*args, **kwargs)
        monkeypatch.setitem(table, name, wrapper)

    counted("gspo", policy_losses.POLICY_LOSSES)
    counted("opo", engine.controller.advantages.GROUP_ADVANTAGES)
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("quickstart.yaml", ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=2",
                                                  "actor_rollout_ref.actor.policy_loss.loss_mode=gspo",
                                                  "algorithm.adv_estimator=opo"])
    assert resolved.roles.critic is None  # opo, like grpo, needs no critic
    train_in_process(resolved, tmp_path / "run")
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in rows] == [1, 2]
    assert all(math.isfinite(row["actor/pg_loss"]) for row in rows)
    # one advantage computation per step; 16 prompts x 8 samples = 128 sequences a step in micro batches of 16:
    # 8 loss calls a step
    assert calls == {"opo": 2, "gspo": 16}
