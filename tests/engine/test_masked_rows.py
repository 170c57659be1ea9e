"""engine.batch.masked_rows: the rows the tokenizer decodes and vLLM is given, without their padding."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.batch import masked_rows  # noqa: E402
from engine.rollout.base import prompt_token_lists  # noqa: E402


def test_each_row_keeps_its_masked_ids_in_order_whatever_the_masks_dtype():
    ids = torch.tensor([[0, 0, 5, 6], [7, 8, 9, 1], [2, 0, 3, 0]])
    mask = torch.tensor([[0, 0, 1, 1], [1, 1, 1, 1], [1, 0, 1, 0]])
    expected = [[5, 6], [7, 8, 9, 1], [2, 3]]
    for m in (mask, mask.bool(), mask.float()):
        assert masked_rows(ids, m) == expected
    assert masked_rows(ids, torch.zeros_like(mask)) == [[], [], []]
    assert prompt_token_lists({"input_ids": ids, "attention_mask": mask}) == expected


def test_it_agrees_with_boolean_indexing_row_by_row():
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 500, (64, 40), generator=generator)
    mask = (torch.rand(64, 40, generator=generator) > 0.3).long()
    assert masked_rows(ids, mask) == [row[keep.bool()].tolist() for row, keep in zip(ids, mask)]


def test_a_mask_of_another_shape_raises_instead_of_cutting_rows():
    with pytest.raises(IndexError):
        masked_rows(torch.ones(2, 4, dtype=torch.long), torch.ones(2, 3, dtype=torch.long))
