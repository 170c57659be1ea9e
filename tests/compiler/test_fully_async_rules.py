"""The fully async schedule's rules that depend on the rollout backend (rlconf/rules/offpolicy.py)."""

from __future__ import annotations

import pytest

from rlconf.compile import compile_plan

VLLM = ["actor_rollout_ref.rollout.name=vllm", "trainer.device=cuda"]


def _codes(overrides: list[str]) -> list[str]:
    result = compile_plan("presets/quickstart_fullasync.yaml", overrides)
    assert not result.errors, [d.message for d in result.errors]
    return [d.code for d in result.diagnostics]


@pytest.mark.parametrize("per_replica, warned", [(4, True), (8, True), (16, False), (64, False)])
def test_rl371_warns_when_vllm_holds_fewer_groups_than_a_replicas_share_of_a_step(per_replica, warned) -> None:
    # the quickstart's step takes 16 groups on one replica: a window of 4 or 8 holds part of it, 16 (or more) all
    codes = _codes(VLLM + [f"async_training.concurrent_samples_per_replica={per_replica}"])
    assert ("RL371" in codes) is warned


def test_rl371_names_the_window_the_sequences_and_the_fix() -> None:
    result = compile_plan("presets/quickstart_fullasync.yaml", VLLM)  # the preset's window of 4 groups, n = 8
    (rl371,) = [d for d in result.diagnostics if d.code == "RL371"]
    assert "at most 4 groups in its engine at once (concurrent_samples_per_replica), of the 16" in rl371.message
    assert "32 sequences instead of 128" in rl371.message
    assert "concurrent_samples_per_replica=16" in rl371.help


def test_rl371_leaves_hf_generate_alone() -> None:
    # the CPU quickstart streams 4 groups at a time on purpose; the measured cost is vLLM's engine batch
    assert "RL371" not in _codes([])
