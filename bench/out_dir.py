"""Where a bench script writes its files: --out when given, else $OUT (the lent GPU machine's folder that comes
back), else a new temporary folder.

An explicit --out wins over $OUT: a driver started in the background of one device call inherits that call's
$OUT, which the next call empties; the 2026-11-28 7B run lost a launch's log that way (FileNotFoundError).
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def out_dir(explicit: str | os.PathLike | None, prefix: str) -> Path:
    """The folder to write into (made if missing): `explicit`, else $OUT, else a fresh temp dir named `prefix`…"""
    chosen = Path(explicit or os.environ.get("OUT") or tempfile.mkdtemp(prefix=prefix))
    chosen.mkdir(parents=True, exist_ok=True)
    return chosen
