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


def _compiled_under_fsdp(model_dir, device: str, implementation: str | None = None
                         ) -> tuple[list[set[int]], list[int], list[int], object]:
    """The layers as the engine runs them (FSDP2 around the compiled forward), fed packed rows of three sizes
    (tokens, sequences, longest sequence; the same padded width), each batch first without gradients (a log-prob
    pass) and then with them (an update): (the symbolic sizes' hints of each graph compiled, graphs compiled so far
    after each batch, each batch's tokens, the model's config)."""
    dist = pytest.importorskip("torch.distributed")
    from rows import rollout_rows

    from engine.models.compile import compile_decoder_layers
    from engine.models.loading import load_causal_lm
    from engine.workers.fsdp.sharding import apply_fsdp, decoder_layers
    from engine.workers.sequence.packing import pack_rows, packed_forward, use_packed_attention

    graphs: list[set[int]] = []  # per graph compiled: the hints of its symbolic sizes

    def record(graph_module, example_inputs):
        sizes = [size for value in example_inputs
                 for size in (value.shape if isinstance(value, torch.Tensor) else [value])]
        graphs.append({int(size.node.hint) for size in sizes if isinstance(size, torch.SymInt)})
        return graph_module.forward

    g = torch.Generator().manual_seed(0)
    rows = [rollout_rows(prompts, responses, 8, 12, g)
            for prompts, responses in (([3, 5], [7, 2]), ([8, 1, 4], [12, 9, 3]), ([6, 2], [4, 11]))]
    cuda = device == "cuda"
    dtype = torch.bfloat16 if cuda else torch.float32  # the flash kernels take 16-bit inputs
    torch._dynamo.reset()
    assert not dist.is_initialized()
    dist.init_process_group("nccl" if cuda else "gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        model = load_causal_lm(model_dir).to(dtype).train()
        compile_decoder_layers(decoder_layers(model), backend=record)
        model = apply_fsdp(model, dtype, True, torch.device(device))
        implementation = use_packed_attention(model, torch.device(device), implementation)
        if cuda:
            assert implementation == "rlconf_varlen"  # the kernel that reads the longest sequence's int
        compiled_after = []  # graphs compiled so far, after each row
        for batch in rows:  # as a step runs them: the π_old pass (no grad), then the update's forward and backward
            batch = {key: value.to(device) for key, value in batch.items()}
            with torch.no_grad():
                packed_forward(model, pack_rows(batch))
            packed_forward(model, pack_rows(batch)).float().mean().backward()
            compiled_after.append(len(graphs))
    finally:
        dist.destroy_process_group()
        torch._dynamo.reset()
    return graphs, compiled_after, [int(batch["attention_mask"].sum()) for batch in rows], model.config


def test_under_fsdp_only_the_row_sizes_are_symbolic_and_new_rows_do_not_recompile(tiny_model_dir):
    """Graphs for the first batch, none for the others; no symbolic size is the hidden size, a head count, the
    head dim or the MLP's width. With `dynamic=True` the head dim was symbolic under FSDP2, and inductor's rotary
    kernels divided by it for every element (6-9x slower on H100); with automatic dynamic shapes alone, every new
    size recompiled once."""
    graphs, compiled_after, tokens, config = _compiled_under_fsdp(tiny_model_dir, "cpu")
    constants = {config.hidden_size, config.num_attention_heads, config.num_key_value_heads,
                 config.hidden_size // config.num_attention_heads, config.intermediate_size}
    assert not constants & set(tokens)
    hints = set().union(*graphs)
    assert not hints & constants, f"model sizes made symbolic: {sorted(hints & constants)}"
    assert tokens[0] in hints, hints
    assert compiled_after[0] > 0
    assert compiled_after == compiled_after[:1] * len(tokens), f"graphs compiled after each row: {compiled_after}"


def _reads_the_longest_sequence(module, query, key, value, attention_mask, scaling=None, dropout=0.0, **kwargs):
    """Attention that, as the CUDA varlen kernel does, takes the micro batch's longest sequence (an int keyword
    argument) into its computation; causal over the whole packed row (the graphs, not the math, are under test)."""
    bound = kwargs["max_length_q"]
    out = torch.nn.functional.scaled_dot_product_attention(query, key, value, is_causal=True, scale=scaling,
                                                           enable_gqa=True)
    return (out * (bound // bound)).transpose(1, 2), None


@pytest.mark.parametrize("marked", [True, False], ids=["marked_dynamic", "left_to_automatic_dynamic"])
def test_the_longest_sequence_int_does_not_recompile_the_layers(tiny_model_dir, monkeypatch, marked):
    """The varlen kernel's int (max_length_q, the longest sequence: 10, 20 and 13 tokens in the three batches) is
    traced as a symbolic int from the first compile (engine.models.compile.DYNAMIC_INTS): no graph after the first
    batch's. Left to dynamo's automatic dynamic shapes (the `left_to_...` case), its first new value recompiles."""
    import contextlib

    from transformers import AttentionInterface

    from engine.models import compile as compile_module

    AttentionInterface.register("rlconf_test_int_reader", _reads_the_longest_sequence)
    if not marked:
        monkeypatch.setattr(compile_module, "_dynamic_ints", contextlib.nullcontext)
    _, compiled_after, tokens, _ = _compiled_under_fsdp(tiny_model_dir, "cpu", "rlconf_test_int_reader")
    assert compiled_after[0] > 0
    if marked:
        assert compiled_after == compiled_after[:1] * len(tokens), f"graphs compiled after each row: {compiled_after}"
    else:
        assert compiled_after[1] > compiled_after[0], compiled_after


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none; run on the GPU machine)")
def test_on_cuda_a_new_longest_sequence_does_not_recompile_the_layers(tiny_model_dir):
    """On CUDA the varlen attention reads an int, the micro batch's longest sequence (max_length_q: 10, 20 and 13
    tokens in the three batches), which the compiled layers trace as a symbolic int from the first compile: no
    graph after the first batch's (left to automatic dynamic shapes, its first new value recompiled the layers)."""
    _, compiled_after, tokens, _ = _compiled_under_fsdp(tiny_model_dir, "cuda")
    assert compiled_after[0] > 0
    assert compiled_after == compiled_after[:1] * len(tokens), f"graphs compiled after each row: {compiled_after}"


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


def test_a_step_after_the_first_compiles_no_layer_graph(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Through the trainer (in process), four GRPO steps of two optimizer steps each, so each step runs a π_old
    pass before the update; packed rows, checkpointing on, compiled layers (a backend that records the graphs).
    Step 1 compiles two graphs, one per grad mode, and no later step compiles one. Before: the update left the
    model in training mode, so step 2's π_old pass (no grad, training) compiled its graphs again (1-2 s at
    1.5B-7B on H200s); and checkpointing's input hook made the first layer's input require grad in no-grad
    passes, a graph of its own."""
    from rlconf.compile import compile_plan

    import engine.workers.roles.actor_rollout_ref as actor_role
    from engine.models.compile import compile_decoder_layers

    graphs: list[bool] = []  # per graph compiled: whether grad mode was on

    def record(graph_module, example_inputs):
        graphs.append(torch.is_grad_enabled())
        return graph_module.forward

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(actor_role, "compile_decoder_layers",
                        lambda layers: compile_decoder_layers(layers, backend=record))
    after_step: list[int] = []
    real_update = actor_role.ActorRolloutRefWorker.update_actor

    def update_and_count(self, batch):
        out = real_update(self, batch)
        assert not self.actor.training, "the update left the actor in training mode"
        after_step.append(len(graphs))
        return out

    monkeypatch.setattr(actor_role.ActorRolloutRefWorker, "update_actor", update_and_count)
    result = compile_plan(PRESETS / "quickstart.yaml", [
        "trainer.n_gpus_per_node=1", "trainer.total_training_steps=4", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "data.train_batch_size=8", "data.max_response_length=8",
        "actor_rollout_ref.actor.ppo_mini_batch_size=4", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=null",
        "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu=null", "actor_rollout_ref.actor.use_dynamic_bsz=true",
        "actor_rollout_ref.actor.ppo_max_token_len_per_gpu=640", "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu=1280",
        "actor_rollout_ref.model.use_remove_padding=true", "actor_rollout_ref.model.compile_layers=true",
        "actor_rollout_ref.model.enable_gradient_checkpointing=true"])
    assert result.resolved is not None, [d.message for d in result.errors]
    assert result.resolved.roles.rollout.log_prob is not None  # two optimizer steps a step: π_old has its pass
    torch._dynamo.reset()
    try:
        _train(result.resolved, tmp_path / "run")
    finally:
        torch._dynamo.reset()
    assert len(after_step) == 4
    assert sorted(graphs[:after_step[0]]) == [False, True], graphs  # step 1: the no-grad pass's, the update's
    assert after_step == after_step[:1] * 4, f"graphs compiled by the end of each step: {after_step}"
