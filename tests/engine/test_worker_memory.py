"""What a worker reports of its memory: the peak of its pass, and on CUDA what it keeps between passes."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.workers.fsdp.memory import resident_metrics  # noqa: E402


def test_a_role_reports_what_it_keeps_on_cuda_less_what_is_not_its_own(monkeypatch):
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *args: 12 * 2**30)
    assert resident_metrics("critic", "cuda") == {"memory/critic_resident_gb": 12.0}
    # The actor's process also holds a sleeping vLLM's pool, which torch still counts: 3 GiB of the 12 are not the actor's.
    assert resident_metrics("actor", "cuda", uncounted_gb=3.0) == {"memory/actor_resident_gb": 9.0}


def test_on_cpu_a_role_reports_no_resident_memory(monkeypatch):
    # The process's resident set includes everything it ever loaded; only its peak is reported there.
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda *args: pytest.fail("no CUDA call on CPU"))
    assert resident_metrics("actor", "cpu") == {}


def test_cached_blocks_go_back_to_the_gpu_on_cuda_only(monkeypatch):
    from engine.workers.fsdp.memory import release_cached_memory

    emptied = []
    monkeypatch.setattr(torch.cuda, "empty_cache", lambda: emptied.append(True))
    release_cached_memory("cpu")
    assert emptied == []
    release_cached_memory("cuda")
    assert emptied == [True]
