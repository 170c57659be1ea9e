"""Turn `data.train_files` / `data.val_files` into local parquet paths.

`synthetic://echo?size=N&seed=S` is generated (engine.data.synthetic) and written as parquet into
the run directory, so synthetic data then goes through exactly the loader real data uses.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import parse_qs, urlparse

SYNTHETIC_SCHEME = "synthetic"


def resolve_data_files(spec: str | list[str], run_dir: Path, split: str) -> list[Path]:
    """Local parquet files for one split; synthetic specs are materialized under run_dir/data/."""
    specs = [spec] if isinstance(spec, str) else list(spec)
    return [_resolve_one(s, run_dir, split, i) for i, s in enumerate(specs)]


def _resolve_one(spec: str, run_dir: Path, split: str, index: int) -> Path:
    url = urlparse(spec)
    if url.scheme != SYNTHETIC_SCHEME:
        path = Path(spec).expanduser()
        if not path.is_file():
            raise FileNotFoundError(f"data file not found: {path} (from data.{split}_files)")
        return path
    if url.netloc != "echo":
        raise ValueError(f"unknown synthetic task {url.netloc!r} in {spec!r}; known: echo")
    query = {key: values[-1] for key, values in parse_qs(url.query).items()}
    size, seed = int(query.get("size", 1024)), int(query.get("seed", 0))
    from engine.data.synthetic import make_synthetic_dataset, write_parquet

    out = run_dir / "data" / f"{split}-{index}-echo-{size}-{seed}.parquet"
    if not out.is_file():
        write_parquet(make_synthetic_dataset(size, seed, split=split), out)
    return out
