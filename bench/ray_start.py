"""Seconds of a local Ray start as `rlconf launch` does it, against Ray's own head processes.

    PYTHONPATH=$PWD python bench/ray_start.py [--rounds 6]

Each round starts a local cluster with engine.launch.start_ray (2 + 1 CPUs, as the CPU quickstart
asks), places 2 trivial actors (the quickstart's worker count) and shuts Ray down, once per case:
`launch` (no dashboard: no dashboard server, no autoscaler monitor) and `ray defaults` (the same call
with Ray's Node.start_api_server / start_monitor, what start_ray did before). The cases take turns
within each round, so a busier stretch of a shared machine falls on both alike; medians at the end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()

    import ray

    import engine.launch

    @ray.remote(num_cpus=1)
    class Probe:
        def pid(self) -> int:
            return os.getpid()

    lean = engine.launch._no_dashboard_server_or_monitor
    cases = {"launch": lean, "ray defaults": lambda: engine.launch.nullcontext()}
    rows: dict[str, list[tuple[float, float, float]]] = {name: [] for name in cases}
    for round_ in range(args.rounds):
        for name, patch in cases.items():
            engine.launch._no_dashboard_server_or_monitor = patch
            try:
                start = time.perf_counter()
                engine.launch.start_ray(None, dashboard=False, num_cpus=3)
                started = time.perf_counter()
                actors = [Probe.remote() for _ in range(2)]
                ray.get([actor.pid.remote() for actor in actors])
                placed = time.perf_counter()
                ray.shutdown()
                done = time.perf_counter()
            finally:
                engine.launch._no_dashboard_server_or_monitor = lean
            rows[name].append((started - start, placed - started, done - placed))
            print(f"round {round_ + 1} {name:<13} start {started - start:5.2f}  2 actors {placed - started:5.2f}  "
                  f"shutdown {done - placed:5.2f}  load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"median of {args.rounds} rounds, seconds:")
    for name, times in rows.items():
        start, actors, shutdown = (statistics.median(t[i] for t in times) for i in range(3))
        total = statistics.median(sum(t) for t in times)
        print(f"  {name:<13} start {start:5.2f}  2 actors {actors:5.2f}  shutdown {shutdown:5.2f}  total {total:5.2f}")


if __name__ == "__main__":
    main()
