"""rlconf: compile a verl-style RL post-training plan into a checked, per-GPU resolved plan.

This package is the compiler. It must never import torch, ray, transformers or
vllm (they live in `engine/`), so that `rlconf validate` stays fast anywhere.
"""

__version__ = "0.1.0"
