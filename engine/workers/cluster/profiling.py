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

    def stop_profile_summary(self, row_limit: int = 30) -> str:
        """Stop recording and return a text summary instead of a trace: the top device kernels by their
        own device time, the top CPU ops by their own CPU time, and the user ranges (record_function).

        A whole step of vLLM decoding is hundreds of thousands of events: its Chrome trace is hundreds
        of MB and slow to write, while these tables are a few KB and what a comparison of ranks needs.
        """
        if self._profiler is None:
            raise RuntimeError(f"{self.ROLE} rank {self.rank}: stop_profile_summary called without start_profile")
        profiler, self._profiler = self._profiler, None
        profiler.stop()
        return profile_summary(profiler.key_averages(), row_limit, f"{self.ROLE} rank {self.rank}")


def profile_summary(averages: Any, row_limit: int, title: str) -> str:
    """Text tables of a profile's key averages: by own device time (kernels, copies) and by own CPU time."""
    device_key = "self_device_time_total" if averages and hasattr(averages[0], "self_device_time_total") \
        else "self_cuda_time_total"
    parts = [f"# {title}"]
    device_total = sum(getattr(event, device_key, 0) for event in averages)
    if device_total > 0:
        parts += [f"## by own device time (total {device_total / 1e6:.3f} s)",
                  averages.table(sort_by=device_key, row_limit=row_limit, max_name_column_width=70)]
    cpu_total = sum(event.self_cpu_time_total for event in averages)
    parts += [f"## by own CPU time (total {cpu_total / 1e6:.3f} s over every thread)",
              averages.table(sort_by="self_cpu_time_total", row_limit=row_limit, max_name_column_width=70)]
    return "\n".join(parts) + "\n"


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
