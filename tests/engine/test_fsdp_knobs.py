"""fsdp_config knobs that change how FSDP2 shards and gathers, not the numbers (engine/workers/fsdp/sharding.py).

One gloo rank on CPU, the tiny Qwen2 model (2 decoder layers, tied embeddings). forward_prefetch:
the layers' FSDP state names the next layer to prefetch, its all-gather has been issued by the time
the layer before it computes, and loss and gradients are the same as without it.
wrap_policy.min_num_params: which modules get their own fully_shard, counted by hand from the
tiny model's shapes, and the same loss and gradients. The workers read both knobs from the plan
(actor, ref and critic).

Parameters of one tiny Qwen2 decoder layer (hidden 64, 4 heads of 16, 2 key/value heads, MLP 128):
  self_attn: q_proj 64*64+64 = 4160, k_proj and v_proj 64*32+32 = 2080 each, o_proj 64*64 = 4096
             -> 12416 in all
  mlp: gate_proj, up_proj, down_proj 64*128 = 8192 each -> 24576
  input_layernorm, post_attention_layernorm: 64 each
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
dist = pytest.importorskip("torch.distributed")

PPO_PRESET = Path(__file__).resolve().parents[2] / "presets" / "quickstart_ppo.yaml"


@pytest.fixture
def one_rank_group():
    """A 1-process gloo group for apply_fsdp, torn down after the test (the workers start their own)."""
    assert not dist.is_initialized()
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _sharded(tiny_model_dir, checkpointing: bool = False, **knobs):
    from engine.models.loading import load_causal_lm
    from engine.workers.fsdp.sharding import apply_fsdp

    model = load_causal_lm(tiny_model_dir).train()
    if checkpointing:
        model.gradient_checkpointing_enable()
    return apply_fsdp(model, torch.float32, True, torch.device("cpu"), **knobs)


def _prefetch_targets(model) -> list[list[int]]:
    """For each decoder layer, the indices of the layers its FSDP state prefetches in forward."""
    from engine.workers.fsdp.sharding import decoder_layers

    states = [layer._get_fsdp_state() for layer in decoder_layers(model)]
    return [[states.index(target) for target in state._states_to_forward_prefetch] for state in states]


def _wrapped(model) -> set[str]:
    """Names of the modules below the root that fully_shard made FSDP modules."""
    from torch.distributed.fsdp import FSDPModule

    return {name for name, module in model.named_modules() if name and isinstance(module, FSDPModule)}


def _layer_wraps(*inner: str) -> set[str]:
    """Both decoder layers, each with the listed submodules wrapped too."""
    return {f"model.layers.{i}{suffix}" for i in range(2) for suffix in (*(f".{name}" for name in inner), "")}


def _loss_grads_and_issued(model) -> tuple[torch.Tensor, dict, list[bool]]:
    """Loss and gradients of one forward/backward; for each layer but the last, whether the next
    layer's all-gather had been issued when this layer's forward began."""
    from engine.workers.fsdp.sharding import decoder_layers

    layers = decoder_layers(model)
    issued = []
    for layer, following in zip(layers, layers[1:]):
        group = following._get_fsdp_state()._fsdp_param_group
        # Registered after fully_shard's own pre-forward hook, so it runs once this layer is gathered.
        layer.register_forward_pre_hook(lambda *_, group=group: issued.append(group._all_gather_result is not None))
    ids = torch.randint(10, 250, (2, 12), generator=torch.Generator().manual_seed(0))
    loss = model(input_ids=ids, use_cache=False).logits.float().log_softmax(-1).mean()
    loss.backward()
    grads = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    return loss.detach(), grads, issued


def test_forward_prefetch_names_the_next_layer_issues_its_gather_early_and_keeps_the_numbers(
        tiny_model_dir, one_rank_group):
    plain = _sharded(tiny_model_dir)
    prefetching = _sharded(tiny_model_dir, forward_prefetch=True)
    # 2 decoder layers: layer 0 prefetches layer 1, the last prefetches nothing; off: none prefetch.
    assert _prefetch_targets(plain) == [[], []]
    assert _prefetch_targets(prefetching) == [[1], []]
    plain_loss, plain_grads, plain_issued = _loss_grads_and_issued(plain)
    loss, grads, issued = _loss_grads_and_issued(prefetching)
    # Without prefetch layer 1 is gathered only when its own forward starts.
    assert plain_issued == [False]
    assert issued == [True]
    # Same weights, same kernels: only the time of the gather moves, so the numbers are bitwise equal.
    torch.testing.assert_close(loss, plain_loss, rtol=0, atol=0)
    assert grads.keys() == plain_grads.keys()
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=0, atol=0, msg=name)


@pytest.mark.parametrize(("min_num_params", "inner"), [
    (0, ()),  # verl's default: the size policy is off, the decoder layers only
    # 12416 >= 10000: the attention block; no MLP projection (8192) reaches it, the MLP (24576) does.
    (10_000, ("self_attn", "mlp")),
    # q, k, v, o stay below 8192, the attention block's 12416 reaches it; each MLP projection is
    # exactly 8192 (at least N wraps), leaving the MLP module nothing of its own.
    (8192, ("self_attn", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")),
    # Only the 64-parameter norms stay below 4096: v/k (2080) do too, but add up in self_attn.
    (4096, ("self_attn.q_proj", "self_attn.o_proj", "self_attn", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")),
])
def test_min_num_params_wraps_modules_bottom_up_by_their_own_parameter_count(
        tiny_model_dir, one_rank_group, min_num_params, inner):
    model = _sharded(tiny_model_dir, min_num_params=min_num_params)
    # The tied embedding / LM head (vocab*64 parameters) is never wrapped alone, nor is model.model,
    # which holds it too: the root owns it.
    assert _wrapped(model) == _layer_wraps(*inner)


def test_min_num_params_wraps_untied_embeddings_and_keeps_the_numbers(tmp_path, tiny_model_dir, one_rank_group):
    from engine.models.tiny import build_tiny_model

    untied = build_tiny_model(tmp_path / "untied", arch="qwen2", tie_word_embeddings=False)
    # Checkpointed layers: the wrapped attention and MLP are gathered again in the recomputation.
    model = _sharded(untied, checkpointing=True, min_num_params=10_000)
    vocab = model.config.vocab_size
    assert vocab * 64 >= 10_000  # so the embedding and the LM head each reach the threshold
    # Untied, the embedding and the LM head are self-contained and large enough; what model.model
    # keeps of its own after them and its layers is the final norm (64), so it is not wrapped.
    assert _wrapped(model) == {"model.embed_tokens", "lm_head", *_layer_wraps("self_attn", "mlp")}
    reference = _sharded(untied, checkpointing=True)
    loss, grads, _ = _loss_grads_and_issued(model)
    plain_loss, plain_grads, _ = _loss_grads_and_issued(reference)
    torch.testing.assert_close(loss, plain_loss, rtol=0, atol=0)
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=0, atol=0, msg=name)


def _plan(*overrides: str):
    from rlconf.compile import compile_plan

    result = compile_plan(PPO_PRESET, ["trainer.n_gpus_per_node=1", "data.train_batch_size=8",
                                       "actor_rollout_ref.actor.ppo_mini_batch_size=8", *overrides])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    return result.resolved


def test_the_workers_apply_the_fsdp_knobs_from_the_plan(tiny_model_dir, monkeypatch):
    import engine.workers.fsdp.sharding as fsdp_module
    from engine.capabilities import ignored_knob_notes
    from engine.workers.roles.actor_rollout_ref import ActorRolloutRefWorker
    from engine.workers.roles.critic import CriticWorker
    from engine.workers.fsdp.sharding import apply_fsdp
    from engine.workers.cluster.local import LocalWorkerGroup

    # fsdp_size only shapes the mesh with several ranks (tests/engine/test_fsdp_hybrid.py); one rank
    # shows that each worker passes its own section's value.
    fsdp_sizes = []

    def spying_apply_fsdp(*args, fsdp_size=-1, **kwargs):
        fsdp_sizes.append(fsdp_size)
        return apply_fsdp(*args, fsdp_size=fsdp_size, **kwargs)

    # apply_fsdp_plan's (the actor's, the critic's) and shard_frozen's (the reference model's)
    monkeypatch.setattr(fsdp_module, "apply_fsdp", spying_apply_fsdp)

    # The actor and the critic prefetch, the reference model does not; each model gets its own
    # size threshold: each reads its own section.
    resolved = _plan("actor_rollout_ref.actor.use_kl_loss=true",
                     "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true",
                     "critic.model.fsdp_config.forward_prefetch=true",
                     "actor_rollout_ref.actor.fsdp_config.wrap_policy.min_num_params=10000",
                     "actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params=8192",
                     "critic.model.fsdp_config.wrap_policy.min_num_params=4096",
                     "actor_rollout_ref.actor.fsdp_config.fsdp_size=1")
    assert resolved.roles.ref is not None
    assert ignored_knob_notes(resolved) == []
    group = LocalWorkerGroup(ActorRolloutRefWorker, "actor_rollout_ref", 1, resolved=resolved,
                             model_path=str(tiny_model_dir), total_training_steps=1, pad_token_id=0, eos_token_id=1)
    try:
        group.call_all("init_model")
        assert _prefetch_targets(group.worker.actor) == [[1], []]
        assert _prefetch_targets(group.worker.ref) == [[], []]
        assert fsdp_sizes == [1, -1]  # the actor's plan value; the reference model has no fsdp_size
        assert _wrapped(group.worker.actor) == _layer_wraps("self_attn", "mlp")
        assert _wrapped(group.worker.ref) == _layer_wraps("self_attn", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")
    finally:
        group.kill()
    group = LocalWorkerGroup(CriticWorker, CriticWorker.ROLE, 1, resolved=resolved, model_path=str(tiny_model_dir),
                             total_training_steps=1)
    try:
        group.call_all("init_model")
        assert _prefetch_targets(group.worker.critic) == [[1], []]
        assert fsdp_sizes == [1, -1, -1]  # the critic's own section (default -1)
        # The value model has no LM head to tie the embedding to, so the embedding (vocab*64) is
        # wrapped alone; the value head (64*1 = 64, below 4096) is not.
        assert _wrapped(group.worker.critic) == {"model.embed_tokens", *_layer_wraps(
            "self_attn.q_proj", "self_attn.o_proj", "self_attn", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    finally:
        group.kill()


def test_a_ppo_step_with_every_fsdp_knob_on_gives_the_same_metrics(tmp_path, monkeypatch):
    """In process, one rank a role: prefetch, size-based wrapping and fsdp_size on for actor, ref and
    critic; the same seeds, so the same rollouts, and the same losses and gradient norms as without."""
    from launching import train_in_process

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    base = ("algorithm.use_kl_in_reward=true", "trainer.total_training_steps=1")
    knobs = [f"{section}.{knob}" for section in ("actor_rollout_ref.actor.fsdp_config", "critic.model.fsdp_config")
             for knob in ("forward_prefetch=true", "wrap_policy.min_num_params=4096", "fsdp_size=1")]
    knobs += ["actor_rollout_ref.ref.fsdp_config.forward_prefetch=true",
              "actor_rollout_ref.ref.fsdp_config.wrap_policy.min_num_params=4096"]
    (plain,) = train_in_process(_plan(*base), tmp_path / "plain").history
    (knobbed,) = train_in_process(_plan(*base, *knobs), tmp_path / "knobs").history
    keys = ("actor/pg_loss", "actor/grad_norm", "critic/vf_loss", "critic/grad_norm", "kl_in_reward/kl")
    assert all(key in plain for key in keys), sorted(plain)
    for key in keys:
        assert knobbed[key] == plain[key], key
