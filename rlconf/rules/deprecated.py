"""Deprecated keys (RL106 warning, RL107 error when the replacement is set too).

verl's `check_mutually_exclusive` (verl/utils/config.py) rejects setting both spellings.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.schema.common import DEPRECATED_KEYS


def _has(raw: dict[str, Any], dotted: str) -> bool:
    node: Any = raw
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return node is not None


def check_deprecated(raw: dict[str, Any]) -> Iterator[Diagnostic]:
    for old, new in DEPRECATED_KEYS.items():
        if not _has(raw, old):
            continue
        old_leaf, new_leaf = old.rpartition(".")[2], new.rpartition(".")[2]
        if _has(raw, new):
            yield error("RL107", old, f"both `{old_leaf}` (deprecated) and `{new_leaf}` are set",
                        help=f"remove `{old_leaf}`; `{new_leaf}` is per GPU")
        else:
            yield warning("RL106", old, f"`{old_leaf}` is deprecated: it is global and gets divided by the data-parallel size",
                          help=f"set `{new_leaf}` instead (`rlconf explain` shows the per-GPU value this one maps to)")
    if _has(raw, "data.val_batch_size"):
        yield warning("RL106", "data.val_batch_size", "`data.val_batch_size` is deprecated: validation runs over the whole set as one batch",
                      help="remove it")
