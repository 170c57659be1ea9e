"""bench/out_dir.py: an explicit --out wins over $OUT (a background driver inherits a device call's $OUT, which the
next call empties), $OUT over a temp dir."""

from __future__ import annotations

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from out_dir import out_dir  # noqa: E402


def test_an_explicit_out_wins_over_the_environment_and_is_made(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "device_out"))
    chosen = out_dir(tmp_path / "mine" / "t7", "x_")
    assert chosen == tmp_path / "mine" / "t7" and chosen.is_dir()
    assert not (tmp_path / "device_out").exists()


def test_without_out_the_environment_then_a_fresh_temp_dir(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("OUT", str(tmp_path / "device_out"))
    assert out_dir(None, "x_") == tmp_path / "device_out"
    monkeypatch.delenv("OUT")
    first, second = out_dir(None, "bench_probe_"), out_dir(None, "bench_probe_")
    assert first != second and first.name.startswith("bench_probe_") and first.is_dir()
    first.rmdir(), second.rmdir()
