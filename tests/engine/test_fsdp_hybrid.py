"""fsdp_config.fsdp_size: hybrid sharding (HSDP) on 4 gloo processes on CPU, the tiny Qwen2 model in fp32.

fsdp_size 2 of 4 ranks: a (2 replicas, 2 shards) mesh; each rank holds half of each parameter
(1-D sharding over all 4: a quarter), and one forward/backward on each rank's own rows gives the
same loss-mean gradients and gradient norm as sharding over all 4 ranks.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

WORLD, FSDP_SIZE = 4, 2


def test_mesh_shape_is_flat_unless_fsdp_size_splits_the_ranks():
    from engine.workers.fsdp.sharding import mesh_shape

    assert mesh_shape(4, -1) == (4,)
    assert mesh_shape(4, 4) == (4,)  # a group as large as the world is plain FSDP
    assert mesh_shape(4, 8) == (4,)
    assert mesh_shape(8, 2) == (4, 2)  # 4 replicas of 2 shards
    assert mesh_shape(4, 1) == (4, 1)  # every rank a whole copy (DDP-like)
    with pytest.raises(ValueError, match="fsdp_size 3 does not divide the 4 ranks"):
        mesh_shape(4, 3)


def _gradients(rank: int, model_dir: str) -> dict:
    from torch.distributed.tensor import Replicate, Shard

    from engine.models.loading import load_causal_lm
    from engine.workers.fsdp.sharding import apply_fsdp, clip_grad_norm_, full_state_dict

    # Each rank its own rows, as data parallelism gives it.
    ids = torch.randint(10, 250, (2, 12), generator=torch.Generator().manual_seed(rank))
    out = {}
    for fsdp_size in (-1, FSDP_SIZE):
        model = apply_fsdp(load_causal_lm(model_dir).train(), torch.float32, True, torch.device("cpu"),
                           fsdp_size=fsdp_size)
        weight = model.model.layers[0].mlp.gate_proj.weight  # [128, 64]
        loss = model(input_ids=ids, use_cache=False).logits.float().log_softmax(-1).mean()
        loss.backward()
        grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
        out[fsdp_size] = {"mesh": tuple(weight.device_mesh.shape), "placements": tuple(weight.placements),
                          "local_rows": weight.to_local().shape[0], "grads": grads,
                          "norm": clip_grad_norm_(model, 1e9), "weights": full_state_dict(model)}
    assert out[-1]["placements"] == (Shard(0),)
    assert out[FSDP_SIZE]["placements"] == (Replicate(), Shard(0))
    return out


def _rank_main(rank: int, port: int, model_dir: str, plan, out_path: str, step_dir: str) -> None:
    """Both parts of this file in one set of 4 processes (starting them is most of the time)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    out = {"gradients": _gradients(rank, model_dir), "checkpoint": _checkpoint(rank, model_dir, plan, step_dir),
           "gathered": _gathered()}
    if rank == 0:
        torch.save(out, out_path)
    dist.barrier()
    dist.destroy_process_group()


# 4 processes (forked with torch and transformers imported: tests/engine/ranks.py), shared by the tests below.
@pytest.fixture(scope="module")
def hybrid_runs(tiny_model_dir, tmp_path_factory) -> dict:
    from ranks import spawn_ranks

    from engine.workers.cluster.failure import free_port
    from rlconf.compile import compile_plan

    plan = compile_plan(Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml",
                        ["trainer.n_gpus_per_node=4", "actor_rollout_ref.actor.optim.lr=1e-3"]).resolved
    tmp = tmp_path_factory.mktemp("hybrid")
    spawn_ranks(_rank_main, args=(free_port(), str(tiny_model_dir), plan, str(tmp / "out.pt"), str(tmp / "step")),
                nprocs=WORLD)
    return torch.load(tmp / "out.pt", weights_only=False)


@pytest.mark.slow
def test_hybrid_sharding_holds_half_of_each_parameter_and_gives_the_same_gradients(hybrid_runs):
    out = hybrid_runs["gradients"]
    flat, hybrid = out[-1], out[FSDP_SIZE]
    assert (flat["mesh"], hybrid["mesh"]) == ((4,), (2, 2))
    # gate_proj's 128 rows: 128 / 4 = 32 per rank over all ranks, 128 / 2 = 64 within a group of 2.
    assert (flat["local_rows"], hybrid["local_rows"]) == (32, 64)
    # Both average the 4 ranks' gradients (reduce-scatter in a group, then all-reduce over the
    # replicas, vs one reduce-scatter): only the order of the float sums differs.
    assert hybrid["grads"].keys() == flat["grads"].keys()
    for name, grad in flat["grads"].items():
        assert grad.abs().sum() > 0, name
        torch.testing.assert_close(hybrid["grads"][name], grad, rtol=1e-5, atol=1e-7, msg=name)
    torch.testing.assert_close(hybrid["norm"], flat["norm"], rtol=1e-5, atol=0)
    # The full weights (what the rollout and checkpoints gather) come back whole from either mesh.
    for name, weight in flat["weights"].items():
        torch.testing.assert_close(hybrid["weights"][name], weight, rtol=0, atol=0, msg=name)


class _Uneven(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.a, self.b, self.c = torch.nn.Linear(5, 7), torch.nn.Linear(7, 3), torch.nn.Linear(5, 7, bias=False)
        self.c.weight = self.a.weight
        self.register_buffer("scale", torch.arange(6.0))

    def forward(self, x):  # fully_shard needs one; never called
        return self.b(self.a(x))


def _gathered() -> dict:
    """The rollout's weight gather (engine.workers.fsdp.gather) on the flat and the hybrid mesh, against
    DTensor's own full_tensor(), for row counts that 4 ranks (and groups of 2) do not divide evenly."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from engine.workers.fsdp.gather import full_tensors, row_group

    out = {}
    for shape in ((WORLD,), (WORLD // FSDP_SIZE, FSDP_SIZE)):
        torch.manual_seed(0)  # the same weights on every rank, as a loaded checkpoint gives
        # Rows 7 over 4 ranks: 2, 2, 2, 1; rows 3: 1, 1, 1, 0 (a rank with an empty shard); a weight
        # tied to another, as HF ties the LM head to the embedding (both in the root's group); a 1-D
        # bias; a buffer FSDP does not shard.
        model = _Uneven()
        mesh = init_device_mesh("cpu", shape, mesh_dim_names=("replicate", "shard")[-len(shape):])
        fully_shard(model.b, mesh=mesh)
        fully_shard(model, mesh=mesh)
        reference = {name: value.full_tensor() if hasattr(value, "full_tensor") else value
                     for name, value in model.state_dict().items()}
        out[shape] = {"reference": reference,
                      # 100 bytes: buckets of a.weight + a.bias (80 + 16 B gathered) and b.weight + b.bias
                      "bf16": dict(full_tensors(model, torch.bfloat16, bucket_bytes=100)),
                      "fp32": dict(full_tensors(model)),  # one bucket for all row-split tensors
                      "row_split": sorted(name for name, value in model.state_dict().items() if row_group(value))}
    return out


@pytest.mark.slow
def test_the_rollout_weight_gather_gives_every_full_tensor_on_flat_and_hybrid_meshes(hybrid_runs):
    for shape, out in hybrid_runs["gathered"].items():
        reference = out["reference"]
        assert out["row_split"] == ["a.bias", "a.weight", "b.bias", "b.weight", "c.weight"], shape  # gathered in buckets
        # c.weight is a.weight: one tensor under the first name.
        assert list(out["fp32"]) == [name for name in reference if name != "c.weight"], shape
        for name, tensor in out["fp32"].items():
            assert tensor.shape == reference[name].shape, (shape, name)
            torch.testing.assert_close(tensor, reference[name], rtol=0, atol=0, msg=f"{shape} {name}")
            torch.testing.assert_close(out["bf16"][name], reference[name].to(torch.bfloat16), rtol=0, atol=0,
                                       msg=f"{shape} {name}")


class _CheckpointedModel:
    """The checkpoint mixin around one model, as a worker uses it (engine.workers.fsdp.checkpointing)."""

    def __init__(self, resolved, rank: int, model, fsdp_size: int) -> None:
        from engine.workers.fsdp.checkpointing import CheckpointingWorker
        from engine.workers.fsdp.sharding import apply_fsdp
        from engine.workers.fsdp.optim import build_optimizer

        self.worker = type("Worker", (CheckpointingWorker,), {})()
        self.worker.resolved, self.worker.rank = resolved, rank
        self.model = apply_fsdp(model.train(), torch.float32, True, torch.device("cpu"), fsdp_size=fsdp_size)
        self.optimizer, self.scheduler = build_optimizer(self.model, resolved.config.actor_rollout_ref.actor.optim, 10)
        self.worker._checkpointables = lambda: {"actor": (self.model, self.optimizer, self.scheduler)}

    def step(self, ids) -> None:
        self.optimizer.zero_grad(set_to_none=True)
        self.model(input_ids=ids, use_cache=False).logits.float().log_softmax(-1).mean().backward()
        self.optimizer.step()
        self.scheduler.step()

    def full(self) -> dict:
        from engine.workers.fsdp.sharding import full_state_dict

        moments = {name: state["exp_avg_sq"].full_tensor() for name, state in
                   ((name, self.optimizer.state[p]) for name, p in self.model.named_parameters())}
        return {"weights": full_state_dict(self.model), "moments": moments, "lr": self.scheduler.get_last_lr()[0]}


def _checkpoint(rank: int, model_dir: str, plan, step_dir: str) -> dict:
    from engine.models.loading import load_causal_lm

    ids = torch.randint(10, 250, (2, 12), generator=torch.Generator().manual_seed(rank))
    hybrid = _CheckpointedModel(plan, rank, load_causal_lm(model_dir), FSDP_SIZE)
    hybrid.step(ids)
    hybrid.worker.save_checkpoint(step_dir)
    saved = hybrid.full()
    hybrid.step(ids)  # the run goes on
    continued = hybrid.full()
    out = {"saved": saved, "continued": continued}
    for name, fsdp_size in (("hybrid", FSDP_SIZE), ("flat", -1)):  # resumed on the same mesh, and resharded
        resumed = _CheckpointedModel(plan, rank, load_causal_lm(model_dir), fsdp_size)
        resumed.worker.load_checkpoint(step_dir)
        out[f"{name}_loaded"] = resumed.full()
        resumed.step(ids)
        out[f"{name}_continued"] = resumed.full()
    return out


@pytest.mark.slow
def test_a_hybrid_sharded_checkpoint_resumes_on_its_mesh_and_on_a_flat_one(hybrid_runs):
    """DCP checkpoints of HSDP shards: weights, Adam moments and the LR schedule come back whole, and the
    next step is the uninterrupted run's, on the (2, 2) mesh it was saved from and resharded over 4 ranks."""
    out = hybrid_runs["checkpoint"]
    saved, continued = out["saved"], out["continued"]
    assert any((continued["weights"][n] != w).any() for n, w in saved["weights"].items())  # the step moved them
    for name in ("hybrid", "flat"):
        loaded, after = out[f"{name}_loaded"], out[f"{name}_continued"]
        assert loaded["lr"] == saved["lr"] and after["lr"] == continued["lr"]
        for key in ("weights", "moments"):
            for param, value in saved[key].items():
                torch.testing.assert_close(loaded[key][param], value, rtol=0, atol=0, msg=f"{name} {key} {param}")
                torch.testing.assert_close(after[key][param], continued[key][param], rtol=1e-5, atol=1e-7,
                                           msg=f"{name} next step {key} {param}")
