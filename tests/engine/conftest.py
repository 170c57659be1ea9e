"""Shared fixtures for engine tests."""

from __future__ import annotations

from pathlib import Path

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
