"""The vLLM backend's wake-up, without vLLM: torch's cached blocks go back first, and a pool that still
does not fit names the knobs (engine.rollout.vllm.VLLMRollout._wake)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


class _FakeLLM:
    def __init__(self, error: Exception | None) -> None:
        self.error, self.woken = error, []

    def wake_up(self, tags):
        if self.error is not None:
            raise self.error
        self.woken.extend(tags)


def _rollout(error, monkeypatch):
    from engine.rollout import vllm as backend

    rollout = backend.VLLMRollout.__new__(backend.VLLMRollout)
    rollout.llm, rollout._asleep, rollout._seconds = _FakeLLM(error), {"weights", "kv_cache"}, {}
    monkeypatch.setattr(backend.VLLMRollout, "pool_bytes", lambda self: 20 * 2**30)
    emptied = []
    monkeypatch.setattr(backend.torch.cuda, "empty_cache", lambda: emptied.append(True))
    return rollout, emptied


def test_the_cache_is_emptied_before_each_wake_up(monkeypatch) -> None:
    rollout, emptied = _rollout(None, monkeypatch)
    rollout._wake("kv_cache")
    rollout._wake("kv_cache")  # awake already: nothing to do
    assert rollout.llm.woken == ["kv_cache"] and emptied == [True] and rollout._asleep == {"weights"}
    assert "wake_kv_cache" in rollout._seconds


def test_an_out_of_memory_wake_up_names_the_knobs(monkeypatch) -> None:
    rollout, _ = _rollout(RuntimeError("CUDA Error: out of memory at /workspace/csrc/cumem_allocator.cpp:163"),
                          monkeypatch)
    with pytest.raises(RuntimeError) as info:
        rollout._wake("kv_cache")
    message = str(info.value)
    assert "could not map its kv cache (20.0 GiB" in message
    assert "gpu_memory_utilization" in message and "param_offload" in message and "cumem_allocator" in message


def test_other_errors_pass_through(monkeypatch) -> None:
    rollout, _ = _rollout(RuntimeError("engine core died"), monkeypatch)
    with pytest.raises(RuntimeError, match="^engine core died$"):
        rollout._wake("weights")
