"""Micro batches by row count or token budget (use_dynamic_bsz), trimmed of shared padding."""

from __future__ import annotations

import random

import pytest

torch = pytest.importorskip("torch")

from rows import rollout_rows  # noqa: E402

from engine.workers.passes.micro_batches import (  # noqa: E402
    forward_by_micro_batch,
    pack_by_budget,
    padded_cost,
    plan_micro_batches,
    row_extents,
    split_to,
    trim,
)


def _rows(prompt_lengths: list[int], response_lengths: list[int], prompt_width: int = 8, response_width: int = 6):
    batch = rollout_rows(prompt_lengths, response_lengths, prompt_width, response_width, torch.Generator().manual_seed(0))
    batch["advantages"] = torch.randn(len(prompt_lengths), response_width)
    return batch


def test_row_extents_are_the_real_prompt_and_response_lengths():
    assert row_extents(_rows([3, 8, 1], [6, 0, 2])) == ([3, 8, 1], [6, 0, 2])


def test_packing_keeps_every_row_once_and_every_group_within_the_budget():
    rng = random.Random(0)
    for _ in range(200):
        rows = rng.randint(1, 40)
        prompts = [rng.randint(1, 64) for _ in range(rows)]
        responses = [rng.randint(0, 64) for _ in range(rows)]
        budget = rng.randint(128, 1024)
        groups = pack_by_budget(prompts, responses, budget)
        assert sorted(i for g in groups for i in g) == list(range(rows))
        assert all(padded_cost(g, prompts, responses) <= budget for g in groups)
        # Packed greedily: a group's next row (longest first) did not fit, so no two groups could merge trivially.
        assert len(groups) <= rows


def test_a_row_longer_than_the_budget_gets_a_micro_batch_of_its_own():
    assert pack_by_budget([10, 2, 2], [10, 2, 2], budget=8) == [[0], [1, 2]]


def test_splitting_to_an_agreed_count_halves_the_largest_groups_and_keeps_every_row():
    groups = split_to([[0, 1, 2, 3], [4]], 4)
    assert groups == [[0], [1], [2, 3], [4]] or sorted(map(len, groups)) == [1, 1, 1, 2]
    assert sorted(i for g in groups for i in g) == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="cannot make 3 micro batches out of 2 rows"):
        split_to([[0], [1]], 3)


def test_fixed_size_plans_are_consecutive_slices():
    assert plan_micro_batches(_rows([1] * 5, [1] * 5), micro_batch_size=2, token_budget=0) == [[0, 1], [2, 3], [4]]


def test_trimming_drops_only_columns_that_are_padding_in_every_row():
    batch = _rows([3, 5], [2, 4])
    trimmed, response_width = trim(batch)
    assert response_width == 4
    assert trimmed["input_ids"].shape == (2, 5 + 4) and trimmed["advantages"].shape == (2, 4)
    assert int(trimmed["attention_mask"].sum()) == int(batch["attention_mask"].sum())
    # Position ids of real tokens are unchanged (taken from the full rows).
    kept = trimmed["attention_mask"].bool()
    assert trimmed["position_ids"][kept].tolist() == batch["position_ids"][batch["attention_mask"].bool()].tolist()


def test_trimmed_micro_batches_give_the_log_probs_of_the_full_rows(tiny_model_dir):
    from engine.models.loading import load_causal_lm
    from engine.workers.passes.logprob import response_log_probs

    model = load_causal_lm(tiny_model_dir).eval()
    batch = _rows([3, 8, 1, 5, 2], [6, 1, 3, 0, 4])
    with torch.no_grad():
        full, _ = response_log_probs(model, batch, temperature=1.0)
        (by_budget,) = forward_by_micro_batch(batch, None, 20, lambda m: (response_log_probs(model, m, 1.0)[0],))
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(by_budget[mask], full[mask], rtol=1e-4, atol=1e-5)
    assert by_budget.shape == full.shape  # back to [rows, R]; values at padding are never read


def test_outputs_come_back_in_row_order_whatever_the_grouping():
    batch = _rows([8, 1, 7, 2, 6, 3], [6, 1, 5, 2, 4, 3])
    row_ids = torch.arange(6, dtype=torch.float32)[:, None]
    # Each row's response width in its (trimmed) micro batch varies; fill the row with its original index.
    batch["row_id"] = row_ids.expand(-1, 6).clone()
    (out,) = forward_by_micro_batch(batch, None, 24, lambda m: (m["row_id"],))
    mask = batch["response_mask"].bool()
    assert torch.equal(out[mask], row_ids.expand(-1, 6)[mask])
