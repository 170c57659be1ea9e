"""engine.controller.stages.rollout_backend_metrics: each rank's rollout timings as the step's metrics."""

from __future__ import annotations

import pytest

pytest.importorskip("torch")

from engine.controller.stages import rollout_backend_metrics  # noqa: E402


def test_the_slowest_rank_gives_each_figure_and_the_fastest_one_its_generation_beside_it():
    per_rank = [{"generate_in_worker": 2.5, "engine_cpu": 2.4, "peak_gb": 20.0},
                {"generate_in_worker": 3.1, "engine_cpu": 2.9, "peak_gb": 19.0}]
    assert rollout_backend_metrics(per_rank) == {
        "timing/rollout_generate_in_worker": 3.1, "timing/rollout_engine_cpu": 2.9, "memory/rollout_peak_gb": 20.0,
        "timing/rollout_generate_in_worker_min": 2.5}


def test_one_rank_has_no_fastest_figure_and_a_rank_without_generation_is_not_counted():
    assert "timing/rollout_generate_in_worker_min" not in rollout_backend_metrics([{"generate_in_worker": 2.5}])
    found = rollout_backend_metrics([{"generate_in_worker": 2.5}, {"gather_weights": 0.1}])
    assert "timing/rollout_generate_in_worker_min" not in found and found["timing/rollout_gather_weights"] == 0.1
