"""Rollout backends: HF `generate` (runs anywhere) and vLLM (the GPU fast path), behind one interface.

`build_rollout` picks the backend from rollout.name; engine.rollout.base says what a backend does.
"""

from __future__ import annotations

from engine.rollout.base import RolloutBackend, Sampling, assemble_rows, mask_after_eos

__all__ = ["RolloutBackend", "Sampling", "assemble_rows", "mask_after_eos"]
