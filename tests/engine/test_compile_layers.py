"""model.compile_layers (engine/models/compile.py): each decoder layer's forward through torch.compile.

The replacement keeps what the rest of the engine relies on (class, parameter names, FSDP and
gradient checkpointing around the layer) without compiling; the compiled layers' numbers against
eager are checked on CPU through the real training path (slow: inductor compiles on first use),
for the actor and reference (GRPO with KL) and the critic (PPO). On a GPU the bench measures them
(bench/train_knobs.py `...+compile_layers`).
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
@pytest.mark.parametrize(("preset", "knobs", "compiled"), [
    # GRPO with a KL loss, so the reference model runs (and compiles) too; packed sequences.
    ("quickstart.yaml", ["actor_rollout_ref.actor.use_kl_loss=true", "actor_rollout_ref.model.use_remove_padding=true",
                         "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu=8"],
     [4]),
    # PPO: the critic's layers compile too (critic.model.compile_layers); padded rows.
    ("quickstart_ppo.yaml", ["actor_rollout_ref.model.use_remove_padding=false", "critic.model.use_remove_padding=false"],
     [2, 2]),
], ids=["grpo_ref_packed", "ppo_critic_padded"])
def test_compiled_layers_train_as_the_eager_ones(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, preset, knobs,
                                                  compiled) -> None:
    """One training step in process with every decoder layer compiled against the same plan eager:
    the same samples, and losses, gradient norms and entropy equal up to fp32 rounding."""
    from rlconf.compile import compile_plan

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    common = ["trainer.n_gpus_per_node=1", "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4",
              "trainer.total_training_steps=1", "trainer.test_freq=-1", *knobs]
    if "ppo" in preset:
        common += ["critic.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
                   "critic.ppo_micro_batch_size_per_gpu=4"]
    plans = {}
    for on in (False, True):
        switch = [f"{section}.model.compile_layers={str(on).lower()}"
                  for section in ("actor_rollout_ref", "critic") if section == "actor_rollout_ref" or "ppo" in preset]
        result = compile_plan(PRESETS / preset, common + switch)
        assert result.resolved is not None, [d.message for d in result.diagnostics]
        plans[on] = result.resolved
    eager, eager_counts = _train(plans[False], tmp_path / "eager")
    fast, counts = _train(plans[True], tmp_path / "compiled")
    assert counts == compiled  # actor (+ reference) layers, then the critic's
    assert eager_counts == [0] * len(compiled)
    keys = [key for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy", "actor/kl_loss", "critic/vf_loss",
                            "critic/grad_norm") if key in eager[0]]
    assert "actor/pg_loss" in keys
    for slow_row, fast_row in zip(eager, fast, strict=True):
        assert fast_row["reward/mean"] == slow_row["reward/mean"]  # the same samples
        for key in keys:
            assert fast_row[key] == pytest.approx(slow_row[key], rel=1e-4, abs=1e-5), key
