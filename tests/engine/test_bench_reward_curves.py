"""bench/reward_curves.py's arithmetic and figure (its launches are the quickstart's, run by hand: 4 × 40 steps)."""

from __future__ import annotations

import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "bench"))

from reward_curves import criterion, moving_mean, svg_plot  # noqa: E402


def test_the_moving_mean_takes_up_to_five_steps_and_the_criterion_is_the_quickstarts() -> None:
    assert moving_mean([1, 2, 3, 4, 5, 6]) == [1, 1.5, 2, 2.5, 3, 4]
    assert criterion([0.01] * 5 + [0.2] * 5) == (0.01, 0.2, True)
    first, last, learned = criterion([0.06] * 5 + [0.1] * 5)  # last < 2 × first
    assert (round(first, 3), round(last, 3), learned) == (0.06, 0.1, False)
    assert not criterion([0.01] * 5 + [0.05] * 5)[2]  # doubled, but under 0.1


def test_the_figure_puts_step_one_left_the_last_step_right_and_zero_at_the_bottom() -> None:
    svg = svg_plot({"sync": [0.0, 0.15, 0.3], "partial": [0.3, 0.3, 0.3]}, "t", width=356, height=180)
    assert svg.startswith("<svg") and svg.rstrip().endswith("</svg>")
    lines = re.findall(r'<polyline points="([^"]+)"', svg)
    assert len(lines) == 4  # raw and smoothed, per series
    raw_sync = [tuple(map(float, p.split(","))) for p in lines[0].split()]
    # plot area: x from 56 to 356 − 150 = 206, y from 180 − 44 = 136 (reward 0) up to 36 (the top, 0.3)
    assert raw_sync == [(56.0, 136.0), (131.0, 86.0), (206.0, 36.0)]
    assert ">sync<" in svg and ">partial<" in svg and ">0.30<" in svg
