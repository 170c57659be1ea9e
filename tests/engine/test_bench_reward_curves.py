"""bench/reward_curves.py's arithmetic and figure (its launches are the quickstart's, run by hand: 4 × 40 steps)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from reward_curves import criterion, moving_mean, plot  # noqa: E402


def test_the_moving_mean_takes_up_to_five_steps_and_the_criterion_is_the_quickstarts() -> None:
    assert moving_mean([1, 2, 3, 4, 5, 6]) == [1, 1.5, 2, 2.5, 3, 4]
    assert criterion([0.01] * 5 + [0.2] * 5) == (0.01, 0.2, True)
    first, last, learned = criterion([0.06] * 5 + [0.1] * 5)  # last < 2 × first
    assert (round(first, 3), round(last, 3), learned) == (0.06, 0.1, False)
    assert not criterion([0.01] * 5 + [0.05] * 5)[2]  # doubled, but under 0.1


def test_the_figure_is_written(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    out = plot({"sync": [0.0, 0.15, 0.3], "partial": [0.3, 0.3, 0.3]}, "t", tmp_path / "curves.png")
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
