"""The bench/ scripts as modules, for the tests that check their parts on CPU."""

from __future__ import annotations

import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parents[2] / "bench"


def bench_module(name: str):
    """bench/<name>.py imported (bench/ on sys.path only while it imports, with the modules it imports itself)."""
    sys.path.insert(0, str(BENCH))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(BENCH))
