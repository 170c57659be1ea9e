"""trainer.logger: metrics.jsonl always, console line, TensorBoard and W&B sinks, clear errors for missing packages."""

from __future__ import annotations

import importlib.machinery
import importlib.util
import json
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("torch")

from engine import loggers  # noqa: E402
from engine.loggers import LoggerUnavailableError, TensorBoardSink, WandbSink, logger_problems, open_sinks  # noqa: E402
from engine.metrics import MetricsFile  # noqa: E402

QUICKSTART = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"


def _resolved(*overrides: str):
    from rlconf.compile import compile_plan

    result = compile_plan(QUICKSTART, list(overrides))
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


def _hide_packages(monkeypatch: pytest.MonkeyPatch, *names: str) -> None:
    """Make find_spec report `names` as not installed, whatever this machine has."""
    real = importlib.util.find_spec
    monkeypatch.setattr(loggers.importlib.util, "find_spec", lambda name, *a: None if name in names else real(name, *a))


class RecordingSink:
    def __init__(self, fail_on_close: bool = False) -> None:
        self.writes: list[tuple[int, dict]] = []
        self.closed = False
        self.fail_on_close = fail_on_close

    def write(self, step, metrics):
        self.writes.append((step, dict(metrics)))

    def close(self):
        self.closed = True
        if self.fail_on_close:
            raise OSError("disk full")


def _trainer(tmp_path: Path, sinks: list, logger: str, lines: list[str]):
    from engine.trainer import Trainer

    resolved = _resolved(f"trainer.logger={logger}")
    return Trainer(resolved, group=None, tokenizer=None, dataset=None, order=None, total_steps=3, reward_manager=None,
                   metrics_file=MetricsFile(tmp_path / "metrics.jsonl"), log=lines.append, sinks=sinks)


def test_every_sink_and_metrics_jsonl_get_each_step_and_console_prints_a_line(tmp_path: Path):
    sink, lines = RecordingSink(), []
    trainer = _trainer(tmp_path, [sink], "[console,tensorboard]", lines)
    trainer.publish(1, {"step": 1, "reward/mean": 0.25})
    trainer.close()
    assert sink.writes == [(1, {"step": 1, "reward/mean": 0.25})]
    assert [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()] == [
        {"step": 1, "reward/mean": 0.25}]
    assert lines == ["step 1/3  reward 0.250"]
    assert sink.closed


def test_without_console_in_trainer_logger_no_step_line_is_printed(tmp_path: Path):
    lines: list[str] = []
    trainer = _trainer(tmp_path, [], "[tensorboard]", lines)
    trainer.publish(1, {"step": 1, "reward/mean": 0.25})
    trainer.close()
    assert lines == []
    assert (tmp_path / "metrics.jsonl").read_text().count("\n") == 1


def test_close_closes_every_sink_even_when_one_fails(tmp_path: Path):
    failing, healthy = RecordingSink(fail_on_close=True), RecordingSink()
    trainer = _trainer(tmp_path, [failing, healthy], "[console]", [])
    with pytest.raises(OSError, match="disk full"):
        trainer.close()
    assert failing.closed and healthy.closed


def test_a_missing_logger_package_names_the_pip_command(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    _hide_packages(monkeypatch, "tensorboard", "wandb")
    problems = logger_problems(["console", "tensorboard", "wandb"])
    assert problems == [
        "trainer.logger lists tensorboard, but the `tensorboard` package is not installed; install it with "
        "`pip install tensorboard` (rlconf's `loggers` extra installs tensorboard and wandb), "
        "or remove tensorboard from trainer.logger",
        "trainer.logger lists wandb, but the `wandb` package is not installed; install it with "
        "`pip install wandb` (rlconf's `loggers` extra installs tensorboard and wandb), "
        "or remove wandb from trainer.logger",
    ]
    with pytest.raises(LoggerUnavailableError, match="pip install tensorboard"):
        TensorBoardSink(tmp_path / "tb")


def test_launch_refuses_before_starting_anything_when_a_logger_package_is_missing(monkeypatch: pytest.MonkeyPatch):
    from engine.capabilities import unsupported_features

    _hide_packages(monkeypatch, "wandb")
    problems = unsupported_features(_resolved("trainer.logger=[console,wandb]"))
    assert any("pip install wandb" in p for p in problems), problems
    assert not any("wandb" in p for p in unsupported_features(_resolved("trainer.logger=[console]")))


def test_tensorboard_sink_writes_scalars_tensorboard_reads_back(tmp_path: Path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    sinks = open_sinks(_resolved("trainer.logger=[console,tensorboard,tensorboard]"), tmp_path)
    assert [type(s) for s in sinks] == [TensorBoardSink]
    for step in (1, 2):
        sinks[0].write(step, {"step": step, "reward/mean": step / 10, "timing/step": 1.5, "note": "text is skipped"})
    sinks[0].close()
    events = EventAccumulator(str(tmp_path / "tensorboard"))
    events.Reload()
    assert sorted(events.Tags()["scalars"]) == ["reward/mean", "timing/step"]
    assert [(e.step, round(e.value, 6)) for e in events.Scalars("reward/mean")] == [(1, 0.1), (2, 0.2)]


def test_wandb_sink_starts_a_run_named_after_the_plan_with_the_resolved_plan_as_config(
        monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    calls: dict[str, list] = {"init": [], "log": [], "finish": []}

    class FakeRun:
        def log(self, data, step):
            calls["log"].append((step, data))

        def finish(self):
            calls["finish"].append(True)

    fake = types.ModuleType("wandb")
    fake.__spec__ = importlib.machinery.ModuleSpec("wandb", None)  # find_spec consults sys.modules first
    fake.init = lambda **kwargs: calls["init"].append(kwargs) or FakeRun()
    monkeypatch.setitem(sys.modules, "wandb", fake)

    resolved = _resolved("trainer.logger=[wandb]", "trainer.project_name=proj", "trainer.experiment_name=exp1")
    (sink,) = open_sinks(resolved, tmp_path)
    assert isinstance(sink, WandbSink)
    sink.write(3, {"step": 3, "reward/mean": 0.5, "epoch": 0})
    sink.close()
    (init,) = calls["init"]
    assert (init["project"], init["name"], init["dir"]) == ("proj", "exp1", str(tmp_path))
    assert init["config"] == json.loads(resolved.model_dump_json())
    assert calls["log"] == [(3, {"reward/mean": 0.5, "epoch": 0.0})]
    assert calls["finish"] == [True]


def test_real_wandb_in_offline_mode_keeps_the_run_under_the_run_dir(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """With wandb installed (`rlconf[loggers]`): WANDB_MODE=offline is honoured and nothing leaves the machine."""
    pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    (sink,) = open_sinks(_resolved("trainer.logger=[wandb]"), tmp_path)
    sink.write(1, {"step": 1, "reward/mean": 0.5})
    sink.close()
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1 and runs[0].stat().st_size > 0
