"""`rlconf report RUN_DIR`: report.png and a summary table from metrics.jsonl; exit 2 with a reason otherwise."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlconf.cli import app

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _step(step: int) -> dict:
    return {
        "step": step, "epoch": 0, "reward/mean": 0.1 * step, "response_length/mean": 4.0 - 0.1 * step,
        "actor/pg_loss": -0.01 * step, "actor/ppo_kl": 0.001 * step, "actor/entropy": 2.0 - 0.05 * step,
        "actor/grad_norm": 1.0 + step, "perf/tokens_per_second": 800.0 + step,
        "timing/generate": 0.5, "timing/reward": 0.01, "timing/update_actor": 1.0, "timing/weight_sync": 0.1,
        "timing/weight_sync_in_worker": 0.05, "timing/step": 1.61,
    }


def _run_dir(tmp_path: Path, lines: list[str]) -> Path:
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "metrics.jsonl").write_text("".join(lines))
    return run_dir


def _invoke(*args: str):
    return CliRunner().invoke(app, ["report", *args])


def test_report_writes_a_png_and_prints_first_last_min_max(tmp_path: Path):
    pytest.importorskip("matplotlib")
    lines = [json.dumps({"step": 0, "val/reward/mean": 0.05}) + "\n"]
    lines += [json.dumps(_step(s) | ({"val/reward/mean": 0.4} if s == 5 else {})) + "\n" for s in range(1, 6)]
    run_dir = _run_dir(tmp_path, lines)
    result = _invoke(str(run_dir))
    assert result.exit_code == 0, result.output
    assert (run_dir / "report.png").read_bytes()[:8] == PNG_SIGNATURE
    rows = {cells[0]: cells[1:] for cells in (line.split() for line in result.output.splitlines()) if len(cells) == 6}
    assert rows["reward/mean"] == ["5", "0.1", "0.5", "0.1", "0.5"]
    assert rows["val/reward/mean"] == ["2", "0.05", "0.4", "0.05", "0.4"]
    assert rows["actor/grad_norm"][1:] == ["2", "6", "2", "6"]
    assert "actor/kl_loss" not in rows  # not logged: no row
    assert f"wrote {run_dir / 'report.png'}" in result.output


def test_a_truncated_last_line_is_skipped_with_a_note(tmp_path: Path):
    pytest.importorskip("matplotlib")
    run_dir = _run_dir(tmp_path, [json.dumps(_step(1)) + "\n", json.dumps(_step(2)) + "\n", '{"step": 3, "rew'])
    out = tmp_path / "elsewhere" / "curves.png"
    result = _invoke(str(run_dir), "--output", str(out))
    assert result.exit_code == 0, result.output
    assert "skipped a truncated last line (metrics.jsonl:3)" in result.output
    assert out.read_bytes()[:8] == PNG_SIGNATURE


def test_a_resumed_run_keeps_the_last_line_of_a_repeated_step(tmp_path: Path):
    from engine.report import read_run_metrics

    lines = [json.dumps(_step(s)) + "\n" for s in (1, 2, 3)] + [json.dumps(_step(3) | {"reward/mean": 0.9}) + "\n"]
    run = read_run_metrics(_run_dir(tmp_path, lines))
    assert [r["step"] for r in run.records] == [1, 2, 3]
    assert run.records[-1]["reward/mean"] == 0.9


@pytest.mark.parametrize("setup, message", [
    ("missing-dir", "run directory not found"),
    ("file", "is a file, not a run directory"),
    ("no-metrics", "no metrics.jsonl in"),
    ("empty", "has no metrics yet"),
    ("bad-middle-line", "metrics.jsonl:2: not a JSON object"),
])
def test_unusable_run_directories_exit_2_saying_why(tmp_path: Path, setup: str, message: str):
    target = tmp_path / "run"
    if setup == "file":
        target.write_text("")
    elif setup == "no-metrics":
        target.mkdir()
    elif setup == "empty":
        _run_dir(tmp_path, ["\n"])
    elif setup == "bad-middle-line":
        _run_dir(tmp_path, [json.dumps(_step(1)) + "\n", "oops\n", json.dumps(_step(2)) + "\n"])
    result = _invoke(str(target))
    assert result.exit_code == 2
    assert message in " ".join(result.output.split())  # rich wraps long lines
    assert not (target / "report.png").exists()
