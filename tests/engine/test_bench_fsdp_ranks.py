"""bench/fsdp_ranks.py: the FSDP knobs' bench on several ranks. Its plans must be compiled for the
ranks (each rank gets the one-GPU bench's rows), and a CPU run over two gloo ranks must produce a row
for each knob, hybrid sharding included."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from bench_scripts import BENCH, bench_module

pytest.importorskip("torch")
pytest.importorskip("transformers")


def test_the_plans_are_compiled_for_every_rank_with_the_variants_fsdp_knobs():
    import argparse

    fsdp_ranks = bench_module("fsdp_ranks")
    parser = argparse.ArgumentParser()
    fsdp_ranks.train_knobs.add_workload_arguments(parser)
    args = parser.parse_args(["--shape", "tiny", "--device", "cpu", "--sequences", "8", "--response-max", "64"])
    resolved = fsdp_ranks.train_knobs.compile_variant(args, fsdp_ranks.VARIANTS["packed+dynamic+fsdp_size_1"], 2)
    assert resolved.config.trainer.n_gpus_per_node == 2
    assert resolved.roles.actor.sequences_per_gpu == 8  # --sequences per rank, one step over both
    assert resolved.config.actor_rollout_ref.actor.fsdp_config.fsdp_size == 1
    prefetch = fsdp_ranks.train_knobs.compile_variant(args, fsdp_ranks.VARIANTS["fast+forward_prefetch"], 2)
    fsdp = prefetch.config.actor_rollout_ref.actor.fsdp_config
    assert fsdp.forward_prefetch and not fsdp.reshard_after_forward


@pytest.mark.slow
def test_two_gloo_ranks_time_each_knob(tmp_path):
    env = {**os.environ, "OUT": str(tmp_path)}
    run = subprocess.run(
        [sys.executable, str(BENCH / "fsdp_ranks.py"), "--device", "cpu", "--shape", "tiny", "--sequences", "8",
         "--prompt-max", "32", "--response-max", "48", "--response-min", "8", "--steps", "1",
         "--variants", "packed+dynamic+forward_prefetch,packed+dynamic+fsdp_size_1"],
        capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
    result = json.loads((tmp_path / "fsdp_ranks.json").read_text())
    assert result["backend"] == "gloo" and result["args"]["world"] == 2
    rows = {row["variant"]: row for row in result["rows"]}
    assert set(rows) == {"packed+dynamic+forward_prefetch", "packed+dynamic+fsdp_size_1"}
    for row in rows.values():
        assert "error" not in row, row
        assert row["seconds_per_update"] > 0 and row["tokens_per_s"] > 0
        # The same weights and rows on every rank: packing leaves the logits as the padded path's.
        assert row["max_logit_diff_vs_padded"] < 1e-4
