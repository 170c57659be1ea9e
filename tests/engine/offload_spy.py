"""What the engine's activation offload does with each tensor autograd saves: copied to the host or left."""

from __future__ import annotations

from typing import Any


def spy_on_offload(monkeypatch: Any) -> tuple[list, list]:
    """Wrap the saved-tensor hooks that engine.workers.fsdp.offload installs; returns (copied, left), the
    tensors its pack copied to the host and those it left where they were, filled as saves happen."""
    import torch

    import engine.workers.fsdp.offload as offload_module

    copied: list = []
    left: list = []
    hooks = torch.autograd.graph.saved_tensors_hooks

    class Spy(hooks):
        def __init__(self, pack, unpack):
            def spying_pack(tensor):
                packed = pack(tensor)
                (left if packed is tensor else copied).append(tensor)
                return packed

            super().__init__(spying_pack, unpack)

    monkeypatch.setattr(offload_module.torch.autograd.graph, "saved_tensors_hooks", Spy)
    return copied, left
