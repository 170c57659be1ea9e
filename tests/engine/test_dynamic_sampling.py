"""Hand-worked cases for DAPO dynamic sampling (engine.dynamic_sampling)."""

from __future__ import annotations

import pytest

from engine.dynamic_sampling import needs_another_batch, select_informative_groups, trim_to_groups


def test_groups_whose_responses_all_score_the_same_are_dropped() -> None:
    # Group 0: [1, 1] all right -> dropped; group 1: [0, 1] -> kept; group 2: [0, 0] all wrong -> dropped;
    # group 3: [0.5, 0.25] -> kept.
    selection = select_informative_groups([0, 0, 1, 1, 2, 2, 3, 3], [1, 1, 0, 1, 0, 0, 0.5, 0.25])
    assert selection.rows == [2, 3, 6, 7]
    assert (selection.kept_groups, selection.total_groups) == (2, 4)


def test_group_labels_need_not_be_contiguous() -> None:
    # Interleaved rows of groups "a" and "b": "a" = [1, 0] kept, "b" = [1, 1] dropped.
    selection = select_informative_groups(["a", "b", "a", "b"], [1, 1, 0, 1])
    assert selection.rows == [0, 2]


def test_generation_continues_until_enough_groups_then_stops() -> None:
    # 3 of 4 needed groups after 1 batch, no limit: generate again; 4 of 4: stop.
    assert needs_another_batch(kept_groups=3, train_batch_size=4, gen_batches=1, max_num_gen_batches=0)
    assert not needs_another_batch(kept_groups=4, train_batch_size=4, gen_batches=1, max_num_gen_batches=0)
    # A limit of 3 batches: after 2 there is one more to go.
    assert needs_another_batch(kept_groups=3, train_batch_size=4, gen_batches=2, max_num_gen_batches=3)


def test_too_few_groups_at_the_batch_limit_is_an_error_naming_the_numbers() -> None:
    # Enough groups on the last allowed batch is fine; too few is an error (as in verl's DAPO trainer).
    assert not needs_another_batch(kept_groups=5, train_batch_size=4, gen_batches=3, max_num_gen_batches=3)
    with pytest.raises(RuntimeError, match=r"kept 3 prompt groups after 3 generation batches.*max_num_gen_batches=3"):
        needs_another_batch(kept_groups=3, train_batch_size=4, gen_batches=3, max_num_gen_batches=3)


def test_trim_keeps_the_first_groups_whole() -> None:
    # Groups 7, 5, 9 with two rows each, 2 groups wanted: the rows of 7 and 5.
    assert trim_to_groups([7, 7, 5, 5, 9, 9], 2) == [0, 1, 2, 3]
    assert trim_to_groups([7, 5, 7, 9, 5, 9], 2) == [0, 1, 2, 4]
