"""RL datasets in verl's parquet schema: the synthetic echo task and GSM8K conversion."""

from engine.data.gsm8k import convert_gsm8k_jsonl
from engine.data.synthetic import DATA_SOURCE as SYNTHETIC_DATA_SOURCE
from engine.data.synthetic import make_synthetic_dataset, read_parquet, write_parquet

__all__ = [
    "SYNTHETIC_DATA_SOURCE",
    "convert_gsm8k_jsonl",
    "make_synthetic_dataset",
    "read_parquet",
    "write_parquet",
]
