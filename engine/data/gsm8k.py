"""Convert GSM8K JSONL (the openai/gsm8k release format) into verl-schema parquet.

Mirrors verl's examples/data_preprocess/gsm8k.py so a dataset converted here is
interchangeable with one made by verl: same data_source, same instruction
suffix, same ground_truth normalisation (commas removed), same extra_info keys.
Working from a local JSONL keeps the engine free of hub downloads.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

DATA_SOURCE = "openai/gsm8k"
# verl's exact wording, so reward extraction ("#### <n>") matches what is asked for.
INSTRUCTION = 'Let\'s think step by step and output the final answer after "####".'

# The GSM8K reference answer ends with "#### <number>"; the number may carry a
# sign, thousands separators or a decimal point.
_FINAL_ANSWER = re.compile(r"####\s*(-?[0-9][0-9,]*(?:\.[0-9]+)?)\s*$")


def extract_reference_answer(answer: str) -> str | None:
    """Return the number after the trailing "####" of a GSM8K answer, commas removed."""
    match = _FINAL_ANSWER.search(answer.strip())
    return match.group(1).replace(",", "") if match else None


def gsm8k_row(question: str, answer: str, split: str, index: int) -> dict[str, Any]:
    """Build one verl-schema row from a GSM8K question/answer pair.

    Raises ValueError if the answer has no trailing "#### <number>".
    """
    ground_truth = extract_reference_answer(answer)
    if ground_truth is None:
        raise ValueError('answer does not end with "#### <number>"')
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user", "content": f"{question} {INSTRUCTION}"}],
        "ability": "math",
        "reward_model": {"style": "rule", "ground_truth": ground_truth},
        "extra_info": {"split": split, "index": index, "answer": answer, "question": question},
    }


def convert_gsm8k_jsonl(in_path: str | Path, out_path: str | Path, split: str,
                        progress: Callable[[int], None] | None = None) -> int:
    """Convert a GSM8K JSONL file to verl-format parquet; return the number of rows written.

    `progress`, if given, is called with the size in bytes of each line read (for a progress bar
    over the file size).

    Blank lines are skipped. Any malformed line (invalid JSON, missing or
    non-string "question"/"answer", no trailing "#### <number>") raises
    ValueError naming the file and its 1-based line number, because silently
    dropping rows would skew an evaluation set without anyone noticing.
    """
    from engine.data.synthetic import write_parquet  # lazy: keeps pyarrow off the import path

    src = Path(in_path)
    if not src.is_file():
        raise FileNotFoundError(f"GSM8K input not found: {src}")
    rows: list[dict[str, Any]] = []
    with src.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if progress is not None:
                progress(len(line.encode("utf-8")))
            if not line.strip():
                continue
            where = f"{src}:{lineno}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{where}: line {lineno} is not valid JSON ({exc.msg})") from exc
            if not isinstance(record, dict):
                raise ValueError(f"{where}: line {lineno} must be a JSON object")
            for field in ("question", "answer"):
                if not isinstance(record.get(field), str):
                    raise ValueError(f"{where}: line {lineno} lacks a string field {field!r}")
            try:
                rows.append(gsm8k_row(record["question"], record["answer"], split, len(rows)))
            except ValueError as exc:
                raise ValueError(f"{where}: line {lineno}: {exc}") from exc
    if not rows:
        raise ValueError(f"{src}: no GSM8K records found")
    write_parquet(rows, out_path)
    return len(rows)
