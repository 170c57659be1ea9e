"""Model builders for tests and CPU smoke runs (tiny random-weight HF checkpoints)."""

from typing import Any

__all__ = ["build_tiny_model", "build_tokenizer"]


def __getattr__(name: str) -> Any:
    # Lazy re-export: an eager import would make `python -m engine.models.tiny`
    # warn that the module was already imported before running as __main__.
    if name in __all__:
        from engine.models import tiny

        return getattr(tiny, name)
    raise AttributeError(f"module 'engine.models' has no attribute {name!r}")
