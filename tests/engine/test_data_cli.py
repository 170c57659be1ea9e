"""`rlconf data synthetic` and `rlconf data gsm8k`: parquet files a plan can name in data.train_files / val_files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlconf.cli import app

pytest.importorskip("pyarrow")

from engine.data.gsm8k import convert_gsm8k_jsonl  # noqa: E402
from engine.data.synthetic import make_synthetic_dataset, read_parquet  # noqa: E402


def _invoke(*args: str):
    return CliRunner().invoke(app, ["data", *args])


def _flat(output: str) -> str:
    return " ".join(output.split())  # rich wraps long lines at the terminal width


def test_synthetic_writes_train_and_val_splits_with_the_given_sizes_and_seeds(tmp_path: Path):
    result = _invoke("synthetic", str(tmp_path / "echo"), "--train-size", "12", "--val-size", "5", "--seed", "3")
    assert result.exit_code == 0, result.output
    assert read_parquet(tmp_path / "echo" / "train.parquet") == make_synthetic_dataset(12, 3, split="train")
    # The validation split is drawn with the next seed: not a prefix of the training split.
    assert read_parquet(tmp_path / "echo" / "val.parquet") == make_synthetic_dataset(5, 4, split="val")
    assert f"data.train_files={tmp_path / 'echo' / 'train.parquet'}" in _flat(result.output)


def test_existing_files_are_kept_unless_force_is_given(tmp_path: Path):
    assert _invoke("synthetic", str(tmp_path), "--train-size", "4", "--val-size", "2").exit_code == 0
    refused = _invoke("synthetic", str(tmp_path), "--train-size", "8", "--val-size", "2")
    assert refused.exit_code == 2
    assert "already exist; pass --force to overwrite" in _flat(refused.output)
    assert len(read_parquet(tmp_path / "train.parquet")) == 4
    forced = _invoke("synthetic", str(tmp_path), "--train-size", "8", "--val-size", "2", "--force")
    assert forced.exit_code == 0, forced.output
    assert len(read_parquet(tmp_path / "train.parquet")) == 8


@pytest.mark.parametrize("args", [("--task", "sort"), ("--train-size", "0")])
def test_unknown_task_or_empty_split_is_a_usage_error(tmp_path: Path, args: tuple[str, str]):
    result = _invoke("synthetic", str(tmp_path), *args)
    assert result.exit_code == 2
    assert not (tmp_path / "train.parquet").exists()


def _gsm8k_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


GOOD = [json.dumps({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}),
        json.dumps({"question": "Big?", "answer": "so\n#### 1,234"})]


def test_gsm8k_converts_every_line(tmp_path: Path):
    src = _gsm8k_jsonl(tmp_path / "test.jsonl", GOOD)
    result = _invoke("gsm8k", str(src), str(tmp_path / "out" / "test.parquet"), "--split", "test")
    assert result.exit_code == 0, result.output
    rows = read_parquet(tmp_path / "out" / "test.parquet")
    assert [r["reward_model"]["ground_truth"] for r in rows] == ["4", "1234"]
    assert {r["extra_info"]["split"] for r in rows} == {"test"}
    assert "(2 rows, split test)" in result.output


def test_gsm8k_malformed_line_exits_2_naming_file_and_line(tmp_path: Path):
    src = _gsm8k_jsonl(tmp_path / "bad.jsonl", [*GOOD, "", "{not json"])
    result = _invoke("gsm8k", str(src), str(tmp_path / "out.parquet"))
    assert result.exit_code == 2
    assert f"{src}:4: line 4 is not valid JSON" in _flat(result.output)
    assert not (tmp_path / "out.parquet").exists()


def test_gsm8k_missing_input_exits_2(tmp_path: Path):
    result = _invoke("gsm8k", str(tmp_path / "nope.jsonl"), str(tmp_path / "out.parquet"))
    assert result.exit_code == 2
    assert "GSM8K input not found" in _flat(result.output)


def test_gsm8k_progress_counts_every_byte_of_the_file(tmp_path: Path):
    src = _gsm8k_jsonl(tmp_path / "train.jsonl", [*GOOD, json.dumps({"question": "é?", "answer": "#### 7"})])
    seen: list[int] = []
    convert_gsm8k_jsonl(src, tmp_path / "out.parquet", "train", progress=seen.append)
    assert sum(seen) == src.stat().st_size


def test_without_pyarrow_the_data_commands_say_what_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "pyarrow" else real(name, *a))
    result = _invoke("synthetic", str(tmp_path))
    assert result.exit_code == 2
    assert "pip install 'rlconf[engine]'" in _flat(result.output)
    assert not (tmp_path / "train.parquet").exists()
