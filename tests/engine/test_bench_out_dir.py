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


def test_no_bench_script_puts_out_before_its_own_out_option():
    """The order the helper keeps, checked where it could be undone: `$OUT or --out` anywhere in bench/."""
    import re

    before = re.compile(r"""environ(?:\.get\(|\[)["']OUT["'][^\n]*\bor\s+args\.out\b""")
    offenders = [path.name for path in sorted((ROOT / "bench").glob("*.py")) if before.search(path.read_text())]
    assert offenders == []
    assert before.search('out = Path(os.environ.get("OUT") or args.out or tempfile.mkdtemp())')  # the pattern bites
