"""Sequence packing (use_remove_padding) computes what the padded forward computes.

The tiny Qwen2 model in fp32 on CPU, a micro batch of ragged rows (prompts of 1..8 tokens, responses
of 0..6, one row with no response). Packed, the rows' real tokens are one row with position ids
restarting per sequence; every attention implementation that can keep them apart must give the
padded forward's numbers:

- log-probs and entropy at every real response token: max abs difference < 1e-5 (measured ~1e-6);
- the PPO loss (policy loss - entropy bonus) and the critic's value loss: rel. difference < 1e-6;
- their gradients on every parameter: relative L2 error < 1e-5, elementwise rtol 1e-4 / atol 1e-6.

The only differences are fp32 summation orders (matmuls over other shapes, another mask). A guard
test shows the comparison is not vacuous: packed rows whose attention crosses sequences differ.
"""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
from rows import rollout_rows

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT_WIDTH, RESPONSE_WIDTH = 8, 6
PROMPT_LENGTHS = [3, 8, 1, 5, 6, 2]
RESPONSE_LENGTHS = [6, 1, 4, 0, 3, 5]
VALUE_ATOL = 1e-5
LOSS_RTOL = 1e-6
GRAD_REL_L2, GRAD_RTOL, GRAD_ATOL = 1e-5, 1e-4, 1e-6
IMPLEMENTATIONS = ["sdpa", "eager", "rlconf_varlen"]  # rlconf_varlen: per-sequence SDPA off CUDA


def _batch(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    batch = rollout_rows(PROMPT_LENGTHS, RESPONSE_LENGTHS, PROMPT_WIDTH, RESPONSE_WIDTH, g)
    rows = len(PROMPT_LENGTHS)
    batch["advantages"] = torch.randn(rows, 1, generator=g).expand(-1, RESPONSE_WIDTH) * batch["response_mask"]
    batch["old_log_probs"] = -3.0 + torch.rand(rows, RESPONSE_WIDTH, generator=g)
    batch["returns"] = torch.randn(rows, RESPONSE_WIDTH, generator=g)
    batch["values"] = torch.randn(rows, RESPONSE_WIDTH, generator=g) * 0.1
    return batch


@pytest.fixture(scope="module")
def actor(tiny_model_dir: Path):
    from engine.models.loading import load_causal_lm

    return load_causal_lm(tiny_model_dir)


def _packed_copy(model, implementation: str):
    from engine.workers.sequence.packing import use_packed_attention

    packed = copy.deepcopy(model)
    assert use_packed_attention(packed, torch.device("cpu"), implementation) == implementation
    return packed


def _grads(model) -> dict[str, torch.Tensor]:
    return {name: p.grad.detach().clone() for name, p in model.named_parameters() if p.grad is not None}


def assert_same_gradients(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    assert actual.keys() == expected.keys()
    diff = sum(float((actual[k] - expected[k]).pow(2).sum()) for k in expected)
    norm = sum(float(expected[k].pow(2).sum()) for k in expected)
    assert norm > 0
    assert (diff / norm) ** 0.5 < GRAD_REL_L2
    for name in expected:
        torch.testing.assert_close(actual[name], expected[name], rtol=GRAD_RTOL, atol=GRAD_ATOL, msg=name)


def _actor_loss(model, batch, options) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    from engine.algos.losses import agg_loss, policy_loss
    from engine.workers.passes.logprob import response_log_probs

    log_probs, entropy = response_log_probs(model, batch, 0.7, with_entropy=True, options=options)
    mask = batch["response_mask"]
    pg = policy_loss(batch["old_log_probs"], log_probs, batch["advantages"], mask, 0.2, 0.2)
    return pg.loss - 0.01 * agg_loss(entropy, mask, "token-mean"), log_probs, entropy


def test_pack_rows_keeps_the_real_tokens_with_positions_restarting_per_sequence():
    from engine.workers.sequence.packing import pack_rows

    batch = _batch()
    packed = pack_rows(batch)
    lengths = [p + r for p, r in zip(PROMPT_LENGTHS, RESPONSE_LENGTHS, strict=True)]
    assert packed.input_ids.shape == (1, sum(lengths))
    assert packed.cu_seqlens.tolist() == [sum(lengths[:i]) for i in range(len(lengths) + 1)]
    assert packed.max_seqlen == max(lengths)
    assert packed.position_ids[0].tolist() == [t for n in lengths for t in range(n)]
    assert packed.input_ids[0].tolist() == batch["input_ids"][batch["attention_mask"].bool()].tolist()
    # The position that predicts each response token holds the token just before it.
    assert packed.predict_index.numel() == sum(RESPONSE_LENGTHS)
    before = packed.input_ids[0][packed.predict_index + 1]
    assert before.tolist() == batch["responses"][batch["response_mask"].bool()].tolist()


@pytest.mark.parametrize("implementation", IMPLEMENTATIONS)
def test_packed_log_probs_entropy_loss_and_gradients_equal_the_padded_ones(actor, implementation):
    from engine.workers.passes.logprob import LogitOptions

    batch, mask = _batch(), _batch()["response_mask"].bool()
    packed_model = _packed_copy(actor, implementation)
    actor.zero_grad(set_to_none=True)
    loss, log_probs, entropy = _actor_loss(actor, batch, LogitOptions())
    loss.backward()
    packed_loss, packed_log_probs, packed_entropy = _actor_loss(packed_model, batch, LogitOptions(packed=True))
    packed_loss.backward()
    torch.testing.assert_close(packed_log_probs[mask], log_probs[mask], rtol=0, atol=VALUE_ATOL)
    torch.testing.assert_close(packed_entropy[mask], entropy[mask], rtol=0, atol=VALUE_ATOL)
    assert not packed_log_probs[~mask].any()  # packed padding columns hold 0
    assert float(packed_loss.detach()) == pytest.approx(float(loss.detach()), rel=LOSS_RTOL)
    assert_same_gradients(_grads(packed_model), _grads(actor))


@pytest.mark.parametrize("packed", [False, True])
def test_the_head_runs_on_the_positions_that_predict_response_tokens_only(actor, packed):
    """logits_to_keep: the prompts' positions never reach lm_head, and the log-probs are those of the
    full forward's logits at the response positions."""
    from engine.batch import position_ids_from_mask
    from engine.workers.passes.logprob import LogitOptions, response_log_probs, token_log_probs

    batch, mask = _batch(), _batch()["response_mask"].bool()
    rows_seen: list[int] = []
    hook = actor.get_output_embeddings().register_forward_hook(
        lambda _module, args, _out: rows_seen.append(args[0].shape[:-1].numel()))
    try:
        with torch.no_grad():
            log_probs, _ = response_log_probs(actor, batch, 0.7, options=LogitOptions(packed=packed))
    finally:
        hook.remove()
    expected_rows = sum(RESPONSE_LENGTHS) if packed else len(PROMPT_LENGTHS) * (RESPONSE_WIDTH + 1)
    assert rows_seen == [expected_rows]
    with torch.no_grad():
        full = actor(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                     position_ids=position_ids_from_mask(batch["attention_mask"])).logits
    at_responses = full[:, PROMPT_WIDTH - 1:-1].reshape(-1, full.shape[-1])
    expected, _ = token_log_probs(at_responses, batch["responses"].reshape(-1), 0.7, False)
    torch.testing.assert_close(log_probs[mask], expected.reshape(mask.shape)[mask], rtol=0, atol=VALUE_ATOL)


def _backward_nodes(output: torch.Tensor) -> set[str]:
    """The names of every autograd node behind `output`."""
    seen, names, todo = set(), set(), [output.grad_fn]
    while todo:
        node = todo.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(type(node).__name__)
        todo.extend(next_node for next_node, _ in node.next_functions)
    return names


@pytest.mark.parametrize("implementation", ["sdpa", "rlconf_varlen"])
def test_the_packed_forward_takes_its_row_out_of_the_batch_without_a_select(actor, implementation):
    """A select's backward (`x[0]` of [1, T, ...]) fills a zeroed copy of the whole input with the
    gradient: for the logits, a [T, vocab] buffer and its fill and copy in every micro batch's backward.
    The packed row comes out of its batch dimension as a view (squeeze), in the head and in attention."""
    from engine.workers.sequence.packing import pack_rows, packed_forward

    model = _packed_copy(actor, implementation)
    batch = _batch()
    packed = pack_rows(batch)
    logits = packed_forward(model, packed, packed.predict_index)
    assert "SelectBackward0" not in _backward_nodes(logits)


def test_packed_rows_whose_attention_crosses_sequences_give_other_log_probs(actor):
    """The guard: one position-id run over the whole packed row makes it one causal sequence."""
    from engine.workers.passes.logprob import LogitOptions, response_log_probs

    batch = _batch()
    mask = batch["response_mask"].bool()
    padded, _ = response_log_probs(actor, batch, 1.0)
    crossing = dict(batch)
    # Every row's positions shifted past the previous row's: no restart, so no sequence boundary is seen.
    offsets = torch.tensor([0, *torch.tensor(PROMPT_LENGTHS[:-1]).add(torch.tensor(RESPONSE_LENGTHS[:-1])).cumsum(0)])
    crossing["position_ids"] = batch["position_ids"] + offsets[:, None]
    leaked, _ = response_log_probs(actor, crossing, 1.0, options=LogitOptions(packed=True))
    assert (leaked[mask] - padded[mask]).abs().max() > 100 * VALUE_ATOL


def test_varlen_attention_refuses_a_padded_batch(actor):
    model = _packed_copy(actor, "rlconf_varlen")
    batch = _batch()
    with pytest.raises(ValueError, match="packed rows only"):
        model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)


@pytest.mark.parametrize("implementation", ["sdpa", "rlconf_varlen"])
def test_packed_critic_values_loss_and_gradients_equal_the_padded_ones(tiny_model_dir, implementation):
    from engine.algos.losses import value_loss
    from engine.models.loading import load_value_model
    from engine.workers.roles.critic import response_values
    from engine.workers.passes.logprob import LogitOptions

    torch.manual_seed(0)
    critic = load_value_model(tiny_model_dir)
    packed_critic = _packed_copy(critic, implementation)
    batch = _batch(1)
    mask = batch["response_mask"]
    results = []
    for model, options in ((critic, LogitOptions()), (packed_critic, LogitOptions(packed=True))):
        values = response_values(model, batch, options)
        loss, _ = value_loss(values, batch["values"], batch["returns"], mask, 0.5)
        loss.backward()
        results.append((values, loss, _grads(model)))
    (values, loss, grads), (packed_values, packed_loss, packed_grads) = results
    torch.testing.assert_close(packed_values, values, rtol=0, atol=VALUE_ATOL)  # both 0 on padding
    assert float(packed_loss.detach()) == pytest.approx(float(loss.detach()), rel=LOSS_RTOL)
    assert_same_gradients(packed_grads, grads)


def test_packed_token_budget_counts_real_tokens_and_balances_the_micro_batches():
    from engine.workers.passes.micro_batches import plan_micro_batches, row_extents

    g = torch.Generator().manual_seed(3)
    prompts = torch.randint(1, 33, (32,), generator=g)
    responses = torch.randint(0, 65, (32,), generator=g)
    batch = rollout_rows(prompts, responses, 32, 64, g)
    budget = 300
    packed = plan_micro_batches(batch, None, budget, packed=True)
    padded = plan_micro_batches(batch, None, budget)
    p, r = row_extents(batch)
    loads = [sum(p[i] + r[i] for i in group) for group in packed]
    assert sorted(i for group in packed for i in group) == list(range(32))
    assert max(loads) <= budget
    assert len(packed) < len(padded)  # padding no longer counts against the budget
    total = sum(loads)
    assert len(packed) == -(-total // budget) or len(packed) <= len(padded)
    assert max(loads) - min(loads) <= max(p[i] + r[i] for i in range(32))  # LPT: within one row of even


@pytest.mark.parametrize("chunking, checkpointing", [(True, False), (False, True), (True, True)])
def test_entropy_chunking_and_checkpointing_give_the_same_values_and_gradients(actor, chunking, checkpointing):
    from engine.workers.passes.logprob import LogitOptions

    batch = _batch(2)
    mask = batch["response_mask"].bool()
    results = []
    for options in (LogitOptions(packed=True),
                    LogitOptions(packed=True, entropy_chunking=chunking, entropy_checkpointing=checkpointing,
                                 chunk_size=5)):
        actor.zero_grad(set_to_none=True)
        loss, log_probs, entropy = _actor_loss(actor, batch, options)
        loss.backward()
        results.append((loss, log_probs, entropy, _grads(actor)))
    (loss, log_probs, entropy, grads), (loss2, log_probs2, entropy2, grads2) = results
    torch.testing.assert_close(log_probs2[mask], log_probs[mask], rtol=0, atol=1e-6)
    torch.testing.assert_close(entropy2[mask], entropy[mask], rtol=0, atol=1e-6)
    assert float(loss2.detach()) == pytest.approx(float(loss.detach()), rel=LOSS_RTOL)
    assert_same_gradients(grads2, grads)


def test_chunked_logit_math_keeps_no_fp32_vocab_sized_tensor_for_backward():
    """Only the model's own logits are saved: the fp32 [N, V] copy is recomputed chunk by chunk."""
    from engine.workers.passes.logprob import LogitOptions, token_log_probs

    tokens, vocab = 64, 1000
    logits = torch.randn(tokens, vocab, dtype=torch.bfloat16, requires_grad=True)
    labels = torch.randint(0, vocab, (tokens,))

    def saved_fp32_vocab_tensors(options) -> int:
        found = []

        def pack(t):
            if t.dtype == torch.float32 and t.shape[-1] == vocab and t.numel() > 16 * vocab:
                found.append(t.shape)
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            lp, ent = token_log_probs(logits, labels, 1.0, True, options)
        (lp.sum() + ent.sum()).backward()
        return len(found)

    assert saved_fp32_vocab_tensors(LogitOptions()) > 0
    assert saved_fp32_vocab_tensors(LogitOptions(entropy_chunking=True, chunk_size=16)) == 0
    assert saved_fp32_vocab_tensors(LogitOptions(entropy_checkpointing=True)) == 0


@pytest.mark.parametrize(("modules", "expected"), [
    ({"flash_attn": ["flash_attn_varlen_func"]}, "flash_attention_2"),
    # flash-attn-4 installs the same top-level package with only its CuTe kernels (flash_attn.cute) in it:
    # transformers then refuses flash_attention_2, so the packed rows must keep torch's varlen kernel.
    ({"flash_attn": [], "flash_attn.cute": ["flash_attn_varlen_func"]}, "rlconf_varlen"),
    ({}, "rlconf_varlen"),
])
def test_flash_attention_2_is_chosen_only_where_flash_attn_2_is_installed(monkeypatch, modules, expected):
    import sys
    import types

    import torch

    from engine.workers.sequence import packing

    monkeypatch.setitem(sys.modules, "flash_attn", None)  # None: `import flash_attn` fails
    for name, functions in modules.items():
        module = types.ModuleType(name)
        for function in functions:
            setattr(module, function, lambda *args, **kwargs: None)
        monkeypatch.setitem(sys.modules, name, module)
    monkeypatch.setattr(packing, "_torch_flash_available", lambda: True)
    monkeypatch.setattr(packing, "fa4_available", lambda: False)
    assert packing.packed_attention_implementation(torch.device("cuda")) == expected
    assert packing.packed_attention_implementation(torch.device("cpu")) == "sdpa"


def test_an_update_packs_every_micro_batch_before_the_first_forward_and_once(monkeypatch):
    """Packing reads sizes back from the device (a sync); ppo_update does it for all micro batches up
    front (pack_ahead), so none sits between one micro batch's backward and the next forward."""
    import torch

    from engine.workers.sequence import packing
    from engine.workers.passes.ppo_update import MicroResult, ppo_update

    events: list[str] = []
    real = packing._pack_rows
    monkeypatch.setattr(packing, "_pack_rows", lambda batch: events.append("pack") or real(batch))
    model = torch.nn.Linear(1, 1)

    def micro_step(micro, counts) -> MicroResult:
        events.append("step")
        packed = packing.pack_rows(micro)  # what the micro batch's forward does
        return MicroResult(model.weight.sum() * packed.input_ids.float().mean(), {}, {})

    ppo_update(model, torch.optim.SGD(model.parameters(), lr=0.1), _batch(), epochs=1,
               mini_batch_size=len(PROMPT_LENGTHS), micro_batch_size=1, token_budget=0, grad_clip=1.0,
               shuffle=False, generator=torch.Generator(), micro_step=micro_step, prefix="actor", packed=True)
    micros = len(PROMPT_LENGTHS)
    assert events == ["pack"] * micros + ["step"] * micros


def test_a_batch_is_packed_again_when_its_response_mask_is_another_tensor():
    from engine.workers.sequence.packing import pack_rows

    batch = _batch()
    first = pack_rows(batch)
    assert pack_rows(dict(batch)) is first  # the same mask tensors: the same packing
    shorter = batch["response_mask"].clone()
    shorter[0, :] = 0
    again = pack_rows({**batch, "response_mask": shorter})
    assert again is not first and again.predict_index.numel() == first.predict_index.numel() - int(batch["response_mask"][0].sum())


def test_flash_attn_4_where_it_runs_comes_before_flash_attn_2(monkeypatch):
    import sys
    import types

    import torch

    from engine.workers.sequence import packing

    module = types.ModuleType("flash_attn")
    module.flash_attn_varlen_func = lambda *args, **kwargs: None
    monkeypatch.setitem(sys.modules, "flash_attn", module)
    monkeypatch.setattr(packing, "fa4_available", lambda: True)
    assert packing.packed_attention_implementation(torch.device("cuda")) == "rlconf_varlen"
    assert packing.varlen_kernel() == "flash_attn_4"
    assert packing.packed_attention_implementation(torch.device("cpu")) == "sdpa"
