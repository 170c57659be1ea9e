"""Score items in worker processes under a deadline: a hung or crashing scorer costs its item, never the run.

verl's `prime` reward manager scores each response in a process pool and waits at most a timeout
for each (300 s, measured from when the item was handed to the pool, so the whole batch is bounded
by it); an item that times out or raises gets the fallback score 0.0. This pool keeps that bound and
goes further in one respect: each worker holds one item at a time on a pipe of its own, so a worker
that dies (os._exit, a segfault in a C extension) fails only its own item and is replaced, where a
broken `ProcessPoolExecutor` fails every pending item.

Workers are forked: they inherit the scoring closure, so neither the user's function (often from a
file imported under a generated module name) nor the texts are pickled; only item indices go out
and floats come back. A new pool is forked for each batch, so it always sees the batch's items.
"""

from __future__ import annotations

import multiprocessing
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.connection import Connection, wait
from typing import Any

# A worker killed at the deadline gets this long to exit before the next signal.
_JOIN_S = 5.0


@dataclass
class PoolOutcome:
    """Per item, the score (None where it timed out or failed), and why items failed."""

    scores: list[float | None]
    timed_out: list[int] = field(default_factory=list)  # item indices
    failed: dict[int, str] = field(default_factory=dict)  # item index -> the error, for the log


def as_score(result: Any) -> float:
    """verl's reading of a scorer's result: a number (or bool), a dict's "score", or a tuple's first entry."""
    if isinstance(result, dict):
        return float(result["score"])
    if isinstance(result, (list, tuple)):
        return float(result[0])
    if isinstance(result, (int, float)):
        return float(result)
    raise TypeError(f"a scorer returned {type(result).__name__} {result!r}; expected a number, a dict with "
                    "\"score\", or a tuple whose first entry is the score")


def _serve(conn: Connection, score_one: Callable[[int], Any]) -> None:
    """A worker: score the items it is sent, one at a time, until told to stop (None) or the pipe closes."""
    while True:
        try:
            index = conn.recv()
        except (EOFError, OSError):
            return
        if index is None:
            return
        try:
            reply = (index, True, as_score(score_one(index)))
        except BaseException as exc:  # SystemExit and KeyboardInterrupt in a scorer cost its item too
            reply = (index, False, f"{type(exc).__name__}: {exc}")
        conn.send(reply)


class _Worker:
    def __init__(self, context: Any, score_one: Callable[[int], Any]) -> None:
        self.conn, child = context.Pipe()
        self.process = context.Process(target=_serve, args=(child, score_one), daemon=True)
        self.process.start()
        child.close()  # the parent's copy: once the worker dies, recv sees EOF
        self.item: int | None = None

    def give(self, index: int) -> None:
        self.item = index
        self.conn.send(index)

    def stop(self, kill: bool) -> None:
        if kill:
            self.process.kill()
        else:
            try:
                self.conn.send(None)
            except OSError:
                self.process.kill()
        self.process.join(_JOIN_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join(_JOIN_S)
        self.conn.close()


def score_in_processes(score_one: Callable[[int], Any], count: int, processes: int, timeout_s: float) -> PoolOutcome:
    """Score items 0..count-1 with `score_one(index)` in up to `processes` forked workers.

    Every item must finish within `timeout_s` of the call (verl's per-item wait, all items handed over
    at once); items still running or waiting then are timed out and their workers killed.
    """
    outcome = PoolOutcome(scores=[None] * count)
    if count == 0:
        return outcome
    context = multiprocessing.get_context("fork")
    deadline = time.monotonic() + timeout_s
    pending = deque(range(count))
    idle: list[_Worker] = []
    busy: dict[Connection, _Worker] = {}
    started = 0

    def hand_out() -> None:
        nonlocal started
        while pending:
            if not idle and started < min(processes, count):
                idle.append(_Worker(context, score_one))
                started += 1
            if not idle:
                return
            worker = idle.pop()
            worker.give(pending.popleft())
            busy[worker.conn] = worker

    try:
        hand_out()
        while busy:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            for conn in wait(list(busy), timeout=remaining):
                worker = busy.pop(conn)
                try:
                    index, ok, value = conn.recv()
                except (EOFError, OSError):  # the worker died mid-item: its item fails, a fresh worker takes over
                    outcome.failed[worker.item] = f"the scoring process exited (exit code {worker.process.exitcode})"
                    worker.stop(kill=True)
                    started -= 1
                    continue
                if ok:
                    outcome.scores[index] = value
                else:
                    outcome.failed[index] = value
                worker.item = None
                idle.append(worker)
            hand_out()
        outcome.timed_out = sorted([worker.item for worker in busy.values()] + list(pending))
    finally:
        for worker in busy.values():
            worker.stop(kill=True)
        for worker in idle:
            worker.stop(kill=False)
    return outcome
