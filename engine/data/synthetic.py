"""Synthetic "echo" RL task that a tiny random-weight model can learn by RL alone.

Each prompt names one target word ("say red", "repeat: cat", ...) and the correct
response is that word. The design choices all serve one goal: a fast, CPU-only
end-to-end RL smoke test whose reward curve visibly rises within minutes.

* Targets come from a SMALL fixed set, and every target is a single token of the
  tiny tokenizer (engine.models.tiny trains its BPE on these words). A uniformly
  random policy therefore already hits the target with probability ~1/|vocab| on
  the first token, so the reward is nonzero from step 0 and GRPO/PPO get signal.
* Partial credit (0.5) for mentioning the target anywhere makes the reward denser
  still, while full credit requires answering with it first.

Rows follow verl's RL parquet schema (data_source, prompt, ability,
reward_model, extra_info) so the same data loader serves GSM8K and this task.
"""

from __future__ import annotations

import os
import random
from pathlib import Path
from typing import Any

DATA_SOURCE = "rlconf/synthetic_echo"
ABILITY = "echo"

# Kept small on purpose: the smaller the set, the sooner RL discovers it.
TARGET_WORDS: tuple[str, ...] = ("red", "blue", "green", "cat", "dog", "sun", "moon", "star")

# "{w}" is replaced by the target. Several phrasings keep the task from being a
# single memorised string while staying trivially learnable.
PROMPT_TEMPLATES: tuple[str, ...] = (
    "say {w}",
    "repeat: {w}",
    "echo {w}",
    "please say {w}",
    "the word is {w}. say it.",
    "reply with one word: {w}",
)

def make_synthetic_dataset(
    n: int,
    seed: int = 0,
    *,
    split: str = "train",
    targets: tuple[str, ...] = TARGET_WORDS,
) -> list[dict[str, Any]]:
    """Return `n` verl-schema rows of the echo task, deterministic given `seed`.

    Args:
        n: number of rows (>= 0).
        seed: RNG seed; the same (n, seed, split, targets) always gives the same rows.
        split: stored in extra_info["split"] (e.g. "train" / "test").
        targets: the target words to draw from; must be non-empty.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    if not targets:
        raise ValueError("targets must be non-empty")
    # A private Random instance: deterministic and never disturbs global RNG state.
    rng = random.Random(seed)
    rows: list[dict[str, Any]] = []
    for index in range(n):
        target = rng.choice(targets)
        template = rng.choice(PROMPT_TEMPLATES)
        rows.append(
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": template.format(w=target)}],
                "ability": ABILITY,
                "reward_model": {"style": "rule", "ground_truth": target},
                "extra_info": {"split": split, "index": index},
            }
        )
    return rows


def write_synthetic_splits(out_dir: str | Path, train_size: int, val_size: int, seed: int = 0) -> dict[str, Path]:
    """Write `train.parquet` (seed) and `val.parquet` (seed + 1) of the echo task into `out_dir`.

    The validation split gets the next seed, as in the quickstart plan (`synthetic://echo?...&seed=1`
    for validation), so the two splits are drawn independently rather than one being a prefix of the other.
    """
    out = Path(out_dir)
    return {
        "train": write_parquet(make_synthetic_dataset(train_size, seed, split="train"), out / "train.parquet"),
        "val": write_parquet(make_synthetic_dataset(val_size, seed + 1, split="val"), out / "val.parquet"),
    }


def write_parquet(rows: list[dict[str, Any]], path: str | Path) -> Path:
    """Write verl-schema rows to a parquet file (parent dirs created); return the path.

    pyarrow is imported lazily so importing this module stays cheap.
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not rows:
        # An empty table would have no schema and confuse downstream loaders.
        raise ValueError("refusing to write an empty dataset")
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    # Written beside, then renamed: a launch killed mid-write leaves no truncated file that the next launch in
    # the same run directory would take for complete (engine.data.sources writes only a missing one).
    partial = out.with_name(f".{out.name}.{os.getpid()}.partial")
    try:
        pq.write_table(pa.Table.from_pylist(rows), partial)
        os.replace(partial, out)
    finally:
        partial.unlink(missing_ok=True)
    return out


def read_parquet(path: str | Path) -> list[dict[str, Any]]:
    """Read a verl-schema parquet file back into a list of row dicts."""
    import pyarrow.parquet as pq

    return pq.read_table(Path(path)).to_pylist()
