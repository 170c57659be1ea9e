"""`trainer.profile_steps`: a torch.profiler trace of the listed steps from every worker process.

Each worker records what it runs between `start_profile` and `stop_profile` (the controller calls
them around a whole step) and writes a Chrome trace, `<run_dir>/profile/step<k>_<role>_rank<r>.json`,
which chrome://tracing or https://ui.perfetto.dev opens. The controller's own work (reward, GAE)
is not in these traces; its per-stage seconds are the `timing/*` metrics.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch


def trace_path(directory: str | Path, step: int, role: str, rank: int) -> Path:
    return Path(directory) / f"step{step}_{role}_rank{rank}.json"


class StepProfiler:
    """Mixin for workers (they define ROLE and rank): one torch.profiler session per profiled step."""

    ROLE: str
    rank: int
    _profiler: torch.profiler.profile | None = None

    def start_profile(self) -> None:
        if self._profiler is not None:
            raise RuntimeError(f"{self.ROLE} rank {self.rank}: start_profile called while a profile is running")
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self._profiler = torch.profiler.profile(activities=activities)
        self._profiler.start()

    def stop_profile(self, directory: str, step: int) -> str:
        """Stop recording and write this worker's Chrome trace; returns its path."""
        if self._profiler is None:
            raise RuntimeError(f"{self.ROLE} rank {self.rank}: stop_profile called for step {step} without "
                               f"start_profile")
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        path = trace_path(directory, step, self.ROLE, self.rank)
        path.parent.mkdir(parents=True, exist_ok=True)  # one machine: every worker sees the run directory
        profiler.export_chrome_trace(str(path))
        return str(path)


@contextmanager
def profiled_step(groups: Sequence[Any], directory: Path | None, step: int, profile_steps: Sequence[int]
                  ) -> Iterator[None]:
    """Profile every worker of `groups` for the duration of the block, if `step` is listed (and a directory set)."""
    if directory is None or step not in profile_steps:
        yield
        return
    for group in groups:
        group.call_all("start_profile")
    yield
    # Not in a `finally`: after a failed step the workers are gone or broken, and the run stops anyway.
    for group in groups:
        group.call_all("stop_profile", str(directory), step)
