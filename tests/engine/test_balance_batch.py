"""trainer.balance_batch: each rank gets the same number of rows and a similar number of tokens."""

from __future__ import annotations

import random

import pytest

pytest.importorskip("torch")

from engine.batch import balanced_order  # noqa: E402


def _slice_totals(lengths: list[int], order: list[int], parts: int) -> list[int]:
    size = len(order) // parts
    return [sum(lengths[i] for i in order[k * size:(k + 1) * size]) for k in range(parts)]


def test_the_order_is_a_permutation_with_equal_rows_per_rank_and_near_equal_tokens():
    rng = random.Random(0)
    for _ in range(100):
        parts = rng.choice([2, 3, 4, 8])
        lengths = [rng.randint(1, 512) for _ in range(parts * rng.randint(1, 16))]
        order = balanced_order(lengths, parts)
        assert sorted(order) == list(range(len(lengths)))
        totals = _slice_totals(lengths, order, parts)
        # Dealing longest-first back and forth bounds the spread by the longest row.
        assert max(totals) - min(totals) <= max(lengths)


def test_a_sorted_batch_that_would_give_one_rank_all_long_rows_is_evened_out():
    lengths = [500, 480, 470, 460, 20, 10, 10, 5]
    assert _slice_totals(lengths, list(range(8)), 2) == [1910, 45]  # the plain split
    assert _slice_totals(lengths, balanced_order(lengths, 2), 2) == [985, 970]  # 500+460+20+5, 480+470+10+10


def test_rows_that_do_not_split_evenly_are_refused():
    with pytest.raises(ValueError, match="5 rows do not split evenly over 2 ranks"):
        balanced_order([1, 2, 3, 4, 5], 2)
