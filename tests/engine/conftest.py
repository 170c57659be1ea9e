"""Shared fixtures for engine tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight Qwen2 checkpoint + tokenizer, built once per test session.

    Building is offline and takes about a second; sharing it keeps the engine
    suite fast. Tests must treat the directory as read-only.
    """
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    from engine.models.tiny import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny_qwen2"), arch="qwen2")


@pytest.fixture(scope="session")
def quickstart_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Path, int]:
    """`presets/quickstart.yaml` as shipped (40 GRPO steps) through `run_launch`, once per session:
    (resolved plan, run dir, exit code).

    tests/engine/test_grpo_e2e.py reads what it left; tests/engine/test_cluster.py compares its two-node
    run with its metrics. One launch of the same plan instead of two saves about 35 s (checked: with
    trainer.save_freq=-1 the 40 lines of metrics.jsonl are equal, timings and memory aside).
    """
    from launching import launch_preset

    return launch_preset(tmp_path_factory, "quickstart", "quickstart.yaml")
