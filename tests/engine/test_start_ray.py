"""`rlconf launch` without --address starts a Ray cluster of its own, whatever cluster the machine knows of.

ray.init() with no address joins the cluster RAY_ADDRESS or /tmp/ray/ray_current_cluster names (a
stray one, another user's test run) and then refuses num_cpus; a local run must not depend on that.
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("ray")


def test_a_local_start_asks_ray_for_a_new_cluster(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from engine.launch import start_ray

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    start_ray(None, dashboard=False, num_cpus=3)
    assert calls[0]["address"] == "local" and calls[0]["num_cpus"] == 3
    start_ray("10.0.0.1:6379", dashboard=False, num_cpus=3)
    assert calls[1]["address"] == "10.0.0.1:6379" and "num_cpus" not in calls[1]


@pytest.mark.slow
def test_a_local_start_ignores_ray_address_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    import ray

    from engine.launch import start_ray

    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:1")  # nothing listens there
    start_ray(None, dashboard=False, num_cpus=1)
    try:
        assert ray.cluster_resources().get("CPU") == 1  # ours: the one CPU it asked for
    finally:
        ray.shutdown()
