"""Metric sinks for `trainer.logger`: TensorBoard and Weights & Biases, beside the always-on metrics.jsonl.

A sink has `write(step, metrics)` and `close()` (engine.metrics.MetricsFile is one too); the trainer
hands every step's metrics to each. `console` is not a sink: the trainer prints its own line.

Both packages are optional (`pip install 'rlconf[loggers]'`). `logger_problems` names a missing one
with the command that installs it, so `rlconf launch` refuses before Ray or any model starts.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

from engine.problems import MachineShortfall
from rlconf.resolved import ResolvedPlan

# logger name -> the importable package it needs
LOGGER_PACKAGES: dict[str, str] = {"tensorboard": "tensorboard", "wandb": "wandb"}


class MetricSink(Protocol):
    def write(self, step: int, metrics: Mapping[str, Any]) -> None: ...

    def close(self) -> None: ...


class LoggerUnavailableError(RuntimeError):
    """trainer.logger names a logger whose package is not installed."""


def missing_package_message(logger: str) -> str:
    package = LOGGER_PACKAGES[logger]
    # No square brackets (as in rlconf[loggers]): rich, which prints this, would read them as markup.
    return (f"trainer.logger lists {logger}, but the `{package}` package is not installed; install it with "
            f"`pip install {package}` (rlconf's `loggers` extra installs tensorboard and wandb), "
            f"or remove {logger} from trainer.logger")


def logger_problems(loggers: list[str]) -> list[str]:
    """A message per logger whose package is missing (empty: every listed logger can start)."""
    return [MachineShortfall(missing_package_message(name)) for name in loggers
            if name in LOGGER_PACKAGES and importlib.util.find_spec(LOGGER_PACKAGES[name]) is None]


def scalars(metrics: Mapping[str, Any]) -> dict[str, float]:
    """The numeric metrics; `step` is the x axis, not a curve. Non-finite values stay (they show the failure)."""
    return {key: float(value) for key, value in metrics.items()
            if key != "step" and isinstance(value, (int, float)) and not isinstance(value, bool)}


class TensorBoardSink:
    """Scalars under `<run_dir>/tensorboard`; `tensorboard --logdir <run_dir>/tensorboard` shows them."""

    def __init__(self, log_dir: Path) -> None:
        if importlib.util.find_spec("tensorboard") is None:
            raise LoggerUnavailableError(missing_package_message("tensorboard"))
        from torch.utils.tensorboard import SummaryWriter

        self.log_dir = log_dir
        self._writer = SummaryWriter(log_dir=str(log_dir))

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        for key, value in scalars(metrics).items():
            self._writer.add_scalar(key, value, global_step=step)
        # SummaryWriter flushes every 120 s by default; a crashed run should keep its last steps.
        self._writer.flush()

    def close(self) -> None:
        self._writer.close()


class WandbSink:
    """One W&B run per launch: project = trainer.project_name, name = trainer.experiment_name.

    wandb reads WANDB_MODE (offline, disabled), WANDB_API_KEY, WANDB_ENTITY etc. from the environment
    itself; the resolved plan is the run's config, so every derived per-GPU number is searchable there.
    """

    def __init__(self, resolved: ResolvedPlan, run_dir: Path) -> None:
        if importlib.util.find_spec("wandb") is None:
            raise LoggerUnavailableError(missing_package_message("wandb"))
        import wandb

        trainer = resolved.config.trainer
        self._run = wandb.init(project=trainer.project_name, name=trainer.experiment_name, dir=str(run_dir),
                               config=resolved.model_dump(mode="json"))

    def write(self, step: int, metrics: Mapping[str, Any]) -> None:
        self._run.log(scalars(metrics), step=step)

    def close(self) -> None:
        self._run.finish()


def open_sinks(resolved: ResolvedPlan, run_dir: Path) -> list[MetricSink]:
    """The sinks `trainer.logger` asks for besides metrics.jsonl (console is the trainer's own line)."""
    sinks: list[MetricSink] = []
    try:
        for name in dict.fromkeys(resolved.config.trainer.logger):  # a logger listed twice logs once
            if name == "tensorboard":
                sinks.append(TensorBoardSink(run_dir / "tensorboard"))
            elif name == "wandb":
                sinks.append(WandbSink(resolved, run_dir))
    except BaseException:
        close_all(sinks)
        raise
    return sinks


def close_all(sinks: list[MetricSink]) -> None:
    """Close every sink even if one fails; the first failure is raised afterwards."""
    failure: BaseException | None = None
    for sink in sinks:
        try:
            sink.close()
        except Exception as exc:  # keep closing the others: their data matters as much
            failure = failure or exc
    if failure is not None:
        raise failure
