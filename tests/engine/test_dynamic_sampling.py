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


def test_join_parts_stacks_generation_batches_trims_and_renumbers_groups() -> None:
    import torch

    from engine.dynamic_sampling import join_parts, take_rows
    from engine.controller.samples import StepInputs

    def gen_batch(first_row_value: int) -> tuple[StepInputs, dict, torch.Tensor]:
        # 2 groups (ids 0 and 1) of 2 rows; row values first_row_value, +1, +2, +3 identify the rows.
        values = torch.arange(first_row_value, first_row_value + 4)
        samples = StepInputs(prompts={"input_ids": values[:, None]}, group_ids=[0, 0, 1, 1],
                             data_sources=["d"] * 4, ground_truths=[str(int(v)) for v in values], extra_infos=[{}] * 4)
        return samples, {"responses": values[:, None]}, values.float()

    # Batch 1 keeps its group 1 (rows 12, 13); batch 2 keeps both groups (rows 20..23). Wanted: 2 groups,
    # so batch 2's group 1 is trimmed away; batch 1's group 1 and batch 2's group 0 both had id 0 or 1 before
    # and now become 100 and 101.
    parts = [take_rows(*gen_batch(10), rows=[2, 3], gen_batch=1), take_rows(*gen_batch(20), rows=[0, 1, 2, 3], gen_batch=2)]
    samples, batch, scores = join_parts(parts, train_batch_size=2, first_group_id=100)
    assert batch["responses"].flatten().tolist() == [12, 13, 20, 21]
    assert samples.prompts["input_ids"].flatten().tolist() == [12, 13, 20, 21]
    assert samples.ground_truths == ["12", "13", "20", "21"]
    assert samples.group_ids == [100, 100, 101, 101]
    assert scores.tolist() == [12.0, 13.0, 20.0, 21.0]


def test_metric_values_pick_the_raw_score_or_the_penalised_one() -> None:
    import torch

    from engine.dynamic_sampling import metric_values

    # score is the scorer's own (1, 0); seq_reward sees the overlong penalty (-0.5 on the first).
    assert metric_values("score", [1.0, 0.0], torch.tensor([0.5, 0.0])) == [1.0, 0.0]
    assert metric_values("seq_reward", [1.0, 0.0], torch.tensor([0.5, 0.0])) == [0.5, 0.0]
    with pytest.raises(ValueError, match="acc"):
        metric_values("acc", [1.0], torch.tensor([1.0]))


def _round(first_value: int, group_scores: list[list[float]]):
    """A fake generation round: one group per entry of `group_scores` (its responses' scores), rows
    numbered first_value, first_value + 1, ... so the trained rows show where they came from."""
    import torch

    from engine.controller.samples import StepInputs

    rows = sum(len(scores) for scores in group_scores)
    values = torch.arange(first_value, first_value + rows)
    group_ids = [group for group, scores in enumerate(group_scores) for _ in scores]
    scores = [score for group in group_scores for score in group]
    samples = StepInputs(prompts={"input_ids": values[:, None]}, group_ids=group_ids, data_sources=["d"] * rows,
                         ground_truths=[str(int(v)) for v in values], extra_infos=[{}] * rows)
    return samples, {"responses": values[:, None]}, scores, torch.tensor(scores)


def test_rounds_of_a_larger_generation_batch_fill_then_trim_to_train_batch_size() -> None:
    from engine.dynamic_sampling import collect_groups

    # gen_batch_size 3 prompts a round, n 2, train_batch_size 2. Round 1 keeps group 1 only (rows 12, 13);
    # round 2 keeps groups 0 and 2 (rows 20, 21 and 24, 25): 3 groups >= 2, so no third round, and the
    # trim keeps round 1's group and round 2's first one.
    rounds = iter([_round(20, [[0, 1], [1, 1], [1, 0]]), _round(30, [[0, 1], [0, 1], [0, 1]])])
    samples, batch, scores, counts = collect_groups(_round(10, [[1, 1], [0, 1], [0, 0]]), lambda: next(rounds),
                                                    "score", train_batch_size=2, max_num_gen_batches=0,
                                                    first_group_id=40)
    assert batch["responses"].flatten().tolist() == [12, 13, 20, 21]
    assert samples.group_ids == [40, 40, 41, 41]
    assert scores.tolist() == [0.0, 1.0, 0.0, 1.0]
    assert counts == {"dynamic_sampling/gen_batches": 2, "dynamic_sampling/kept_groups": 3,
                      "dynamic_sampling/total_groups": 6}
    assert next(rounds)[0].ground_truths[0] == "30"  # the third round was never drawn


def test_a_first_round_with_enough_groups_draws_no_more() -> None:
    from engine.dynamic_sampling import collect_groups

    def no_more():
        raise AssertionError("a second round was drawn")

    # 4 prompts a round, train_batch_size 2: groups 0, 2 and 3 disagree, the trim keeps 0 and 2.
    samples, batch, _, counts = collect_groups(_round(0, [[0, 1], [1, 1], [1, 0], [0, 1]]), no_more, "score",
                                               train_batch_size=2, max_num_gen_batches=1, first_group_id=0)
    assert batch["responses"].flatten().tolist() == [0, 1, 4, 5]
    assert samples.group_ids == [0, 0, 1, 1]
    assert counts["dynamic_sampling/gen_batches"] == 1 and counts["dynamic_sampling/kept_groups"] == 3


def test_a_group_of_one_response_is_kept_as_verl_keeps_it():
    # verl 0.9.1 filters only groups of 2 or more whose metric is the same (trainer/ppo/v1/replay_buffer.py).
    picked = select_informative_groups(["a", "b", "b", "c"], [1.0, 0.0, 0.0, 0.0])
    assert picked.rows == [0, 3] and picked.kept_groups == 2 and picked.total_groups == 3
