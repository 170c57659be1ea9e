"""The prompt dataset: chat template, left padding, truncation modes, seeded batch order."""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("pyarrow")

from engine.data.dataset import BatchOrder, PromptDataset, PromptTooLongError, read_rows, truncate  # noqa: E402
from engine.data.sources import resolve_data_files  # noqa: E402
from engine.data.synthetic import make_synthetic_dataset  # noqa: E402


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir: Path):
    from engine.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def test_synthetic_uri_is_written_as_parquet_and_read_back_like_real_data(tmp_path: Path) -> None:
    (path,) = resolve_data_files("synthetic://echo?size=10&seed=3", tmp_path, "train")
    assert path.suffix == ".parquet" and path.parent == tmp_path / "data"
    assert read_rows([path]) == make_synthetic_dataset(10, 3, split="train")


def test_missing_data_file_names_the_path(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="nope.parquet"):
        resolve_data_files(str(tmp_path / "nope.parquet"), tmp_path, "train")


def test_prompts_are_chat_templated_and_left_padded_to_max_prompt_length(tokenizer) -> None:
    rows = make_synthetic_dataset(4, 0)
    dataset = PromptDataset(rows, tokenizer, max_prompt_length=32)
    batch = dataset.collate([0, 1, 2])
    assert batch.input_ids.shape == (3, 32) and batch.attention_mask.shape == (3, 32)
    for i in range(3):
        length = int(batch.attention_mask[i].sum())
        assert batch.attention_mask[i, -length:].all() and not batch.attention_mask[i, :-length].any()
        text = tokenizer.decode(batch.input_ids[i, -length:])
        assert text.startswith("<|im_start|>user\n") and text.endswith("<|im_start|>assistant\n")
        assert rows[i]["prompt"][0]["content"] in text
    assert batch.ground_truths == [r["reward_model"]["ground_truth"] for r in rows[:3]]
    assert batch.data_sources == [r["data_source"] for r in rows[:3]]


def test_overlong_prompt_with_truncation_error_says_how_to_fix(tokenizer) -> None:
    dataset = PromptDataset(make_synthetic_dataset(2, 0), tokenizer, max_prompt_length=4, truncation="error")
    with pytest.raises(PromptTooLongError, match="data.truncation"):
        dataset.collate([0])


@pytest.mark.parametrize(("mode", "expected"), [
    ("left", [3, 4, 5, 6]), ("right", [0, 1, 2, 3]), ("middle", [0, 1, 5, 6])])
def test_truncation_modes_keep_the_documented_tokens(mode: str, expected: list[int]) -> None:
    assert truncate(list(range(7)), 4, mode, "row 0") == expected


def test_filter_overlong_prompts_drops_rows_instead_of_truncating(tokenizer) -> None:
    rows = make_synthetic_dataset(8, 0)
    assert len(PromptDataset(rows, tokenizer, max_prompt_length=64, filter_overlong_prompts=True)) == 8
    with pytest.raises(ValueError, match="no rows"):
        PromptDataset(rows, tokenizer, max_prompt_length=4, filter_overlong_prompts=True)


def test_batch_order_is_seeded_drops_the_last_partial_batch_and_rolls_over_epochs() -> None:
    order = BatchOrder(num_rows=10, batch_size=4, seed=7)
    assert order.batches_per_epoch == 2
    epoch0 = [order.next_indices(), order.next_indices()]
    epoch1_first = order.next_indices()
    assert order.state_dict() == {"epoch": 1, "position": 1, "seed": 7, "batch_size": 4, "num_rows": 10}
    assert len(set(sum(epoch0, []))) == 8  # no row twice within an epoch
    again = BatchOrder(num_rows=10, batch_size=4, seed=7)
    assert [again.next_indices(), again.next_indices(), again.next_indices()] == [*epoch0, epoch1_first]
    assert BatchOrder(num_rows=10, batch_size=4, seed=8).next_indices() != epoch0[0]


def test_batch_order_resumes_from_its_state() -> None:
    order = BatchOrder(num_rows=12, batch_size=3, seed=0)
    for _ in range(5):
        order.next_indices()
    resumed = BatchOrder(num_rows=12, batch_size=3, seed=0)
    resumed.load_state_dict(order.state_dict())
    assert resumed.next_indices() == order.next_indices()


def test_generation_batches_not_dividing_the_data_drop_the_rest_and_cross_epochs() -> None:
    # 10 prompts in generation batches of 3 (data.gen_batch_size): 10 // 3 = 3 batches an epoch (verl's
    # drop_last dataloader), so the 10th prompt of each epoch's permutation is never drawn; a DAPO step
    # needing two rounds at position 2 takes epoch 0's last batch and epoch 1's first.
    order = BatchOrder(num_rows=10, batch_size=3, seed=5)
    assert order.batches_per_epoch == 3
    epoch0, epoch1 = order.permutation(0), order.permutation(1)
    draws = [order.next_indices() for _ in range(4)]
    assert draws == [epoch0[0:3], epoch0[3:6], epoch0[6:9], epoch1[0:3]]
    assert epoch0[9] not in sum(draws[:3], [])
    assert (order.epoch, order.position) == (1, 1)


def test_generation_batch_order_resumes_mid_epoch_exactly() -> None:
    # A checkpoint after 4 rounds of 3 (one into epoch 1) resumes at the 5th round, epoch1[3:6].
    order = BatchOrder(num_rows=10, batch_size=3, seed=5)
    for _ in range(4):
        order.next_indices()
    state = order.state_dict()
    assert state == {"epoch": 1, "position": 1, "seed": 5, "batch_size": 3, "num_rows": 10}
    resumed = BatchOrder(num_rows=10, batch_size=3, seed=5)
    resumed.load_state_dict(state)
    assert resumed.next_indices() == order.permutation(1)[3:6] == order.next_indices()


def test_batch_order_refuses_a_state_drawn_with_another_generation_batch() -> None:
    # Resuming a run with another data.gen_batch_size would re-cut the epoch: refused, naming the keys.
    order = BatchOrder(num_rows=12, batch_size=3, seed=0)
    order.next_indices()
    with pytest.raises(ValueError, match=r"a generation batch \(data.gen_batch_size, or data.train_batch_size when "
                                         r"unset\) = 3, this run has 4"):
        BatchOrder(num_rows=12, batch_size=4, seed=0).load_state_dict(order.state_dict())


def test_batch_order_refuses_a_state_drawn_with_another_seed() -> None:
    order = BatchOrder(num_rows=12, batch_size=3, seed=0)
    order.next_indices()
    with pytest.raises(ValueError, match="data.seed = 0, this run has 1"):
        BatchOrder(num_rows=12, batch_size=3, seed=1).load_state_dict(order.state_dict())


def test_unshuffled_order_reads_rows_in_file_order() -> None:
    order = BatchOrder(num_rows=6, batch_size=3, seed=0, shuffle=False)
    assert order.next_indices() == [0, 1, 2]


def test_batch_larger_than_dataset_is_an_error() -> None:
    with pytest.raises(ValueError, match="larger than the dataset"):
        BatchOrder(num_rows=3, batch_size=4, seed=0)


def test_rows_with_images_are_refused_naming_multi_modal_data(tokenizer) -> None:
    """verl's geo3k-style rows (an `images` column) would lose their images in a text-only prompt."""
    row = {"prompt": [{"role": "user", "content": "<image>What is the angle?"}], "data_source": "geo3k",
           "reward_model": {"ground_truth": "30"}, "images": [{"bytes": b"\x89PNG"}]}
    with pytest.raises(ValueError, match="rlconf does not run multi-modal data yet"):
        PromptDataset([row], tokenizer, max_prompt_length=64)
    PromptDataset([{**row, "images": []}], tokenizer, max_prompt_length=64)  # an empty column is text-only
