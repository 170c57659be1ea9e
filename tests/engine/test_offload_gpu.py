"""On a CUDA GPU: each offload knob lowers the measured memory by about what rlconf's estimate says.

One process, one GPU, NCCL: the real `ActorRolloutRefWorker` (HF rollout, reference policy for the KL
loss) around a random Qwen2-shaped model of 143M parameters (hidden 1024, 16 layers, intermediate
2048, a 509-token vocabulary so the logits stay small), bf16 compute. Each variant runs the update
twice on 32 rows of 2048 tokens (two micro batches of 16 rows, one optimizer step) and measures:

- rollout phase: what the worker keeps allocated after its update (what the rollout would sit
  beside): `torch.cuda.memory_allocated()`;
- training phase: the update's peak, `torch.cuda.max_memory_allocated()` from just before it.

The difference from the variant without the knob is compared with the difference of rlconf's
phase totals for the two plans (rlconf/estimate.py). Parameters and moments are exact byte counts,
so those drops must agree within 5%; activation drops within 25%. Without gradient checkpointing
the activation term is a per-token count from the literature, so there the drop must only reach
0.8 × the estimate (it may save more). Each variant also pushes its weights into the HF rollout
copy (the gather from CPU shards) and, for the offloaded states, round-trips a checkpoint.

Skipped without CUDA (CI has none). Run on the GPU machine:
`python -m pytest -q -m gpu tests/engine/test_offload_gpu.py -s` (about 30-60 s on an H100; `-s` prints
the table of measured and estimated drops).
"""

from __future__ import annotations

import gc
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none; run on the GPU machine)"),
]

QUICKSTART = Path(__file__).resolve().parents[2] / "presets" / "quickstart.yaml"
SHAPE = dict(hidden_size=1024, num_layers=16, num_heads=16, num_kv_heads=4, intermediate_size=2048,
             max_position_embeddings=4096)
PROMPT, RESPONSE, ROWS, MICRO = 512, 1536, 32, 16
ACTOR = "actor_rollout_ref.actor.fsdp_config"
NO_CHECKPOINTING = ["actor_rollout_ref.model.enable_gradient_checkpointing=false"]
CHECKPOINTING = ["actor_rollout_ref.model.enable_gradient_checkpointing=true"]
ACTIVATION_OFFLOAD = ["actor_rollout_ref.model.enable_activation_offload=true"]
VARIANTS: dict[str, list[str]] = {
    "off": NO_CHECKPOINTING,
    "param+optimizer offload": NO_CHECKPOINTING + [f"{ACTOR}.param_offload=true", f"{ACTOR}.optimizer_offload=true"],
    "optimizer offload": NO_CHECKPOINTING + [f"{ACTOR}.optimizer_offload=true"],
    "offload_policy": NO_CHECKPOINTING + [f"{ACTOR}.offload_policy=true"],
    "ref param offload": NO_CHECKPOINTING + ["actor_rollout_ref.ref.fsdp_config.param_offload=true"],
    "activation offload": NO_CHECKPOINTING + ACTIVATION_OFFLOAD,
    "checkpointed": CHECKPOINTING,
    "checkpointed+activation offload": CHECKPOINTING + ACTIVATION_OFFLOAD,
}
# variant -> (the variant it is measured against, phase, tolerance: ("rel", x) or ("at least", x))
CHECKS: dict[str, list[tuple[str, str, tuple[str, float]]]] = {
    "param+optimizer offload": [("off", "rollout", ("rel", 0.05)), ("off", "training", ("rel", 0.05))],
    "optimizer offload": [("off", "rollout", ("rel", 0.05)), ("off", "training", ("rel", 0.05))],
    "offload_policy": [("off", "rollout", ("rel", 0.05)), ("off", "training", ("rel", 0.05))],
    "ref param offload": [("off", "rollout", ("rel", 0.05)), ("off", "training", ("rel", 0.05))],
    "activation offload": [("off", "training", ("at least", 0.8))],
    "checkpointed+activation offload": [("checkpointed", "training", ("rel", 0.25))],
}
CHECKPOINTED = ("param+optimizer offload", "offload_policy")


def _plan(model_dir: Path, overrides: list[str]):
    from rlconf.compile import compile_plan

    result = compile_plan(QUICKSTART, [
        f"actor_rollout_ref.model.path={model_dir}", "trainer.device=cuda", "trainer.n_gpus_per_node=1",
        "actor_rollout_ref.model.dtype=bfloat16", "actor_rollout_ref.rollout.dtype=bfloat16",
        f"data.train_batch_size={ROWS // 8}", "actor_rollout_ref.rollout.n=8",
        f"actor_rollout_ref.actor.ppo_mini_batch_size={ROWS // 8}",
        f"actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu={MICRO}",
        f"actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu={MICRO}",
        f"actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu={MICRO}",
        "actor_rollout_ref.actor.use_kl_loss=true",
        f"data.max_prompt_length={PROMPT}", f"data.max_response_length={RESPONSE}",
        "estimate.gpu_memory_gib=80", *overrides,
    ])
    assert result.resolved is not None, [d.message for d in result.diagnostics if d.severity == "error"]
    return result.resolved


def _estimated_gib(resolved) -> dict[str, float]:
    # The HF KV cache is for generating, which this test does not do: left out of both sides alike.
    return {phase.phase: sum(t.gib for t in phase.terms if t.what != "HF generate KV cache")
            for phase in resolved.memory}


def _batch(vocab: int) -> dict[str, torch.Tensor]:
    """Rows at full length (prompt and response without padding): the estimate's worst case."""
    from engine.batch import position_ids_from_mask

    g = torch.Generator().manual_seed(0)
    attention_mask = torch.ones(ROWS, PROMPT + RESPONSE, dtype=torch.long)
    input_ids = torch.randint(10, vocab, (ROWS, PROMPT + RESPONSE), generator=g)
    return {"input_ids": input_ids, "attention_mask": attention_mask,
            "position_ids": position_ids_from_mask(attention_mask), "responses": input_ids[:, PROMPT:],
            "response_mask": torch.ones(ROWS, RESPONSE, dtype=torch.long),
            "advantages": torch.randn(ROWS, 1, generator=g).expand(-1, RESPONSE).contiguous()}


def _measure(resolved, model_dir: Path, tmp_path: Path, name: str) -> dict[str, float]:
    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker
    from engine.workers.fsdp.sharding import full_state_dict

    worker = ActorRolloutRefWorker(resolved, str(model_dir), 0, 1, total_training_steps=10, pad_token_id=0,
                                   eos_token_id=1)
    worker.init_model()
    batch = _batch(worker.rollout.model.config.vocab_size)
    batch["old_log_probs"] = worker.compute_log_prob(batch)["old_log_probs"]
    batch["ref_log_probs"] = worker.compute_ref_log_prob(batch)["ref_log_probs"]
    worker.update_actor(batch)  # warm-up: Adam's moments exist from here on
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    metrics = worker.update_actor(batch)
    torch.cuda.synchronize()
    measured = {"training": torch.cuda.max_memory_allocated() / 2**30,
                "rollout": torch.cuda.memory_allocated() / 2**30,
                # Where the states wait between phases (on a GPU the devices do show it).
                "where": {"actor": next(worker.actor.parameters()).device.type,
                          "moments": {v.device.type for state in worker.optimizer.state.values()
                                      for v in state.values() if v.dim() > 0},
                          "ref": next(worker.ref.parameters()).device.type}}
    assert math.isfinite(metrics["actor/grad_norm"])
    # The weight push gathers CPU shards on the GPU; the HF copy then holds the actor's weights.
    worker.sync_rollout_weights()
    weights = full_state_dict(worker.actor)
    copy = worker.rollout.model.state_dict()
    for key, value in weights.items():
        torch.testing.assert_close(copy[key], value.to(copy[key].dtype), rtol=0, atol=0, msg=key)
    if name in CHECKPOINTED:
        worker.save_checkpoint(str(tmp_path / name))
        worker.update_actor(batch)
        worker.load_checkpoint(str(tmp_path / name))
        for key, value in full_state_dict(worker.actor).items():
            torch.testing.assert_close(value, weights[key], rtol=0, atol=0, msg=key)
    del worker, batch, weights, copy
    gc.collect()
    torch.cuda.empty_cache()
    return measured


@pytest.fixture(scope="module")
def measurements(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, dict]]:
    import engine.workers.roles.actor_rollout_ref as actor_module
    from engine.models.tiny import build_tiny_model
    from engine.workers.cluster.device import join_process_group, listen_for_rendezvous, set_rendezvous_env

    model_dir = build_tiny_model(tmp_path_factory.mktemp("offload_model"), arch="qwen2", weights_dtype="bfloat16",
                                 **SHAPE)
    tmp_path = tmp_path_factory.mktemp("offload_checkpoints")
    set_rendezvous_env(0, 1, "127.0.0.1", listen_for_rendezvous("127.0.0.1"), "127.0.0.1")
    torch.cuda.set_device(0)
    join_process_group(torch.device("cuda", 0), 0, 1)
    join = actor_module.join_process_group
    actor_module.join_process_group = lambda *args: None  # one group serves every variant's worker
    try:
        out = {}
        for name, overrides in VARIANTS.items():
            resolved = _plan(model_dir, overrides)
            out[name] = (_measure(resolved, model_dir, tmp_path, name), _estimated_gib(resolved))
            assert torch.cuda.memory_allocated() < 2**28, f"{name} left memory behind"
    finally:
        actor_module.join_process_group = join
        torch.distributed.destroy_process_group()
    print(f"\n{'variant':34s} {'phase':9s} {'measured GiB':>12s} {'estimated GiB':>13s}")
    for name, (measured, estimated) in out.items():
        for phase in ("rollout", "training"):
            print(f"{name:34s} {phase:9s} {measured[phase]:12.3f} {estimated[phase]:13.3f}")
    return out


@pytest.mark.parametrize("variant", list(CHECKS))
def test_offload_lowers_the_measured_memory_by_about_the_estimated_amount(measurements, variant):
    for reference, phase, (kind, tolerance) in CHECKS[variant]:
        measured = measurements[reference][0][phase] - measurements[variant][0][phase]
        estimated = measurements[reference][1][phase] - measurements[variant][1][phase]
        what = f"{variant} vs {reference}, {phase}: measured drop {measured:.3f} GiB, estimated {estimated:.3f} GiB"
        print(what)
        if kind == "rel":
            assert measured == pytest.approx(estimated, rel=tolerance, abs=0.02), what
        else:
            assert measured >= tolerance * estimated, what


def test_param_offload_saves_nothing_in_the_training_phase_as_estimated(measurements):
    """The update brings the parameters back: what param_offload saves is the rollout phase's."""
    both, optimizer_only = measurements["param+optimizer offload"], measurements["optimizer offload"]
    assert both[1]["training"] == pytest.approx(optimizer_only[1]["training"])
    assert both[0]["training"] == pytest.approx(optimizer_only[0]["training"], rel=0.05)
    assert both[0]["rollout"] < optimizer_only[0]["rollout"]


def test_between_phases_each_offloaded_state_waits_on_the_cpu(measurements):
    cpu = {"actor": "cpu", "moments": {"cpu"}, "ref": "cuda"}
    expected = {"off": {"actor": "cuda", "moments": {"cuda"}, "ref": "cuda"},
                "param+optimizer offload": cpu, "offload_policy": cpu,
                "optimizer offload": {"actor": "cuda", "moments": {"cpu"}, "ref": "cuda"},
                "ref param offload": {"actor": "cuda", "moments": {"cuda"}, "ref": "cpu"}}
    for name, where in expected.items():
        assert measurements[name][0]["where"] == where, name
