"""Per-rank spans of a worker's own time: where each rank spends a stage, not only the slowest one.

The controller's `timing/*` metrics time a stage from the driver, over every rank and the Ray round
trip; `timing/rollout_*` keep the slowest rank's seconds. When ranks slow each other down (two rollout
replicas on one host, a collective waiting for a late peer) what tells the causes apart is each rank's
own account: when it started and ended a stage (wall clock, comparable across processes of one host),
how much of that it spent on the CPU (this process's and this thread's CPU seconds), and how often the
OS took the CPU away from it (involuntary context switches). Workers record named spans here
(nested names joined by "/") and the controller or a benchmark drains them (`drain`, the workers'
`rank_timeline` method). Recording costs a few microseconds a span; nothing is written anywhere.
"""

from __future__ import annotations

import resource
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

MAX_SPANS = 10_000  # a run that never drains keeps only the newest ones


def _usage() -> tuple[float, float, float, int, int]:
    """(wall since the epoch, process CPU s, this thread's CPU s, voluntary, involuntary context switches)."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return time.time(), time.process_time(), time.thread_time(), ru.ru_nvcsw, ru.ru_nivcsw


class RankTimeline:
    def __init__(self) -> None:
        self._spans: list[dict[str, Any]] = []
        self._local = threading.local()  # the open spans' names, per thread

    @contextmanager
    def span(self, name: str, **values: Any) -> Iterator[dict[str, Any]]:
        """Record the block as `<enclosing spans>/name`; the yielded dict takes extra values for the record.

        Durations are wall seconds on this process's clock (perf_counter); `start` is the epoch time,
        so spans of different processes on one host line up.
        """
        stack = self._local.__dict__.setdefault("stack", [])
        stack.append(name)
        full = "/".join(stack)
        extra: dict[str, Any] = dict(values)
        wall0, cpu0, thread0, vol0, invol0 = _usage()
        started = time.perf_counter()
        try:
            yield extra
        finally:
            seconds = time.perf_counter() - started
            _, cpu1, thread1, vol1, invol1 = _usage()
            stack.pop()
            self._append({"span": full, "start": wall0, "seconds": seconds, "cpu_s": cpu1 - cpu0,
                          "thread_cpu_s": thread1 - thread0, "voluntary_switches": vol1 - vol0,
                          "involuntary_switches": invol1 - invol0, **extra})

    def add(self, name: str, **values: Any) -> None:
        """A point record (no duration) under the open spans, e.g. a summary computed inside one."""
        stack = self._local.__dict__.setdefault("stack", [])
        self._append({"span": "/".join([*stack, name]), "start": time.time(), **values})

    def drain(self) -> list[dict[str, Any]]:
        """The spans recorded since the last drain (closed spans, in the order they closed), and forget them."""
        out, self._spans = self._spans, []
        return out

    def _append(self, record: dict[str, Any]) -> None:
        self._spans.append(record)
        if len(self._spans) > MAX_SPANS:
            del self._spans[: len(self._spans) - MAX_SPANS]


def step_time_summary(seconds: list[float]) -> dict[str, float]:
    """Count, total and spread of a loop's iteration times (vLLM's engine steps of one generate)."""
    if not seconds:
        return {"steps": 0}
    ordered = sorted(seconds)
    n = len(ordered)
    median = ordered[n // 2]
    return {"steps": n, "total_s": sum(ordered), "median_ms": median * 1e3, "p90_ms": ordered[min(n - 1, (9 * n) // 10)] * 1e3,
            "max_ms": ordered[-1] * 1e3,
            # Steps at over twice the median: stalls (a preempted CPU, a lock, a sync the others do not pay).
            "slow_steps": sum(1 for s in ordered if s > 2 * median),
            "slow_excess_s": sum(s - median for s in ordered if s > 2 * median)}


# One timeline per process: a worker process holds one rank of each role it runs.
TIMELINE = RankTimeline()
