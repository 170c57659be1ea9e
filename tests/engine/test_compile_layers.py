"""model.compile_layers (engine/models/compile.py): each decoder layer's forward through torch.compile.

The replacement keeps what the rest of the engine relies on (class, parameter names, FSDP and
gradient checkpointing around the layer) without compiling; the compiled layers' numbers against
eager are checked on CPU through the real training path (slow: inductor compiles on first use), in
one PPO step that compiles the actor, the reference (KL loss) and the critic. On a GPU,
tests/engine/test_kernels_gpu.py checks them against eager in bf16 and bench/train_knobs.py
(`...+compile_layers`) measures them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PRESETS = Path(__file__).resolve().parents[2] / "presets"


def test_compiled_layers_keep_their_class_names_and_state_dict(tiny_model_dir):
    from engine.models.compile import compile_decoder_layers, is_compiled
    from engine.models.loading import load_causal_lm
    from engine.workers.fsdp import decoder_layers

    model = load_causal_lm(tiny_model_dir)
    before = {name: type(module) for name, module in model.named_modules()}
    keys = list(model.state_dict())
    assert compile_decoder_layers(decoder_layers(model)) == 2
    assert all(is_compiled(layer) for layer in decoder_layers(model))
    assert not is_compiled(model.model.norm)
    assert {name: type(module) for name, module in model.named_modules()} == before
    assert list(model.state_dict()) == keys  # no `_orig_mod.` prefix: checkpoints and weight sync unchanged
    first = decoder_layers(model)[0].forward
    compile_decoder_layers(decoder_layers(model))  # idempotent: a second call does not wrap the wrapper
    assert decoder_layers(model)[0].forward is first


def _train(resolved, run_dir):
    from launching import train_in_process

    trainer = train_in_process(resolved, run_dir)
    workers = [group.worker for group in (trainer.group, trainer.critic_group) if group is not None]
    return trainer.history, [worker.compiled_layers for worker in workers]


@pytest.mark.slow
def test_compiled_layers_train_as_the_eager_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One PPO training step in process with every decoder layer compiled (actor, reference through a KL
    loss, critic) against the same plan eager: the same samples, and losses, gradient norms and entropy
    equal up to fp32 rounding. The actor packs its rows (varlen attention), the critic pads them."""
    from rlconf.compile import compile_plan

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    common = ["trainer.n_gpus_per_node=1", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
              "critic.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
              "critic.ppo_micro_batch_size_per_gpu=4", "trainer.total_training_steps=1", "trainer.test_freq=-1",
              "actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8",
              "actor_rollout_ref.model.use_remove_padding=true", "critic.model.use_remove_padding=false"]
    plans = {}
    for on in (False, True):
        switch = [f"{section}.model.compile_layers={str(on).lower()}" for section in ("actor_rollout_ref", "critic")]
        result = compile_plan(PRESETS / "quickstart_ppo.yaml", common + switch)
        assert result.resolved is not None, [d.message for d in result.diagnostics]
        plans[on] = result.resolved
    eager, eager_counts = _train(plans[False], tmp_path / "eager")
    fast, counts = _train(plans[True], tmp_path / "compiled")
    assert counts == [4, 2]  # actor and reference layers, then the critic's
    assert eager_counts == [0, 0]
    keys = ["actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss", "critic/vf_loss", "critic/grad_norm"]
    for slow_row, fast_row in zip(eager, fast, strict=True):
        assert fast_row["reward/mean"] == slow_row["reward/mean"]  # the same samples
        for key in keys:
            assert fast_row[key] == pytest.approx(slow_row[key], rel=1e-4, abs=1e-5), key
