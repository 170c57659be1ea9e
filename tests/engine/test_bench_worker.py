"""bench/train_knobs.py builds its actor worker by hand (no rollout, no reference model): it must shard
with every fsdp_config knob of the variant's plan, as init_model does. Until 2026-11-26 it passed
reshard_after_forward=True and no forward_prefetch / wrap_policy, so those rows measured nothing."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

BENCH = Path(__file__).resolve().parents[2] / "bench"


def test_the_bench_worker_shards_with_the_plans_fsdp_knobs():
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    sys.path.insert(0, str(BENCH))
    try:
        import train_knobs
    finally:
        sys.path.remove(str(BENCH))

    parser = argparse.ArgumentParser()
    train_knobs.add_workload_arguments(parser)
    args = parser.parse_args(["--shape", "tiny", "--device", "cpu", "--sequences", "8", "--response-max", "64"])
    overrides = ["dynamic", "actor_rollout_ref.model.use_remove_padding=true",
                 "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false",
                 "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true",
                 "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=1000"]
    config = transformers.Qwen2Config(**train_knobs.SHAPES["tiny"], max_position_embeddings=1024)
    state = transformers.AutoModelForCausalLM.from_config(config).state_dict()
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        resolved = train_knobs.compile_variant(args, overrides)
        worker = train_knobs.engine_worker(resolved, train_knobs.build_model(config, state, torch.device("cpu")),
                                           torch.device("cpu"))
        groups = [module._get_fsdp_state()._fsdp_param_group for module in worker.actor.modules()
                  if isinstance(module, FSDPModule) and module._get_fsdp_state()._fsdp_param_group]
        assert groups and not any(group._reshard_after_forward for group in groups)
        layers = worker.actor.model.layers
        assert layers[0]._get_fsdp_state()._states_to_forward_prefetch == [layers[1]._get_fsdp_state()]
        # min_num_params 1000: modules inside the tiny model's layers get their own fully_shard
        assert isinstance(layers[0].mlp.gate_proj, FSDPModule)
    finally:
        dist.destroy_process_group()
