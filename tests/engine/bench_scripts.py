"""The bench/ scripts as modules, for the tests that check their parts on CPU."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def fake_verl_site(tmp_path: Path, main_source: str) -> tuple[Path, Path]:
    """(a site folder whose `verl.fake_main` runs `main_source`, an empty output folder) under tmp_path: what the
    verl side-by-side benches need of verl's package to start its side, without verl."""
    site = tmp_path / "site"
    (site / "verl" / "trainer" / "config").mkdir(parents=True)
    (site / "verl" / "__init__.py").write_text("")
    (site / "verl" / "fake_main.py").write_text(main_source)
    out = tmp_path / "out"
    out.mkdir()
    return site, out


def bench_module(name: str):
    """bench/<name>.py imported (bench/ on sys.path only while it imports, with the modules it imports itself)."""
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))
