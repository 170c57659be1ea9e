"""HF generate returns the log-probs of what it sampled, under the distribution it sampled from (after
temperature, top-k and top-p): rollout correction and bypass mode then run on CPU too."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT_WIDTH, NEW_TOKENS = 6, 12


def _generate(model_dir, **sampling):
    from engine.models.loading import load_causal_lm
    from engine.rollout.base import Sampling
    from engine.rollout.hf import HFRollout

    model = load_causal_lm(model_dir).float()
    rollout = HFRollout(model, torch.device("cpu"), torch.float32, pad_token_id=0, eos_token_id=1)
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(6, PROMPT_WIDTH, dtype=torch.long)
    mask[::2, :2] = 0  # left padding on every other row
    prompts = {"input_ids": torch.randint(10, 250, (6, PROMPT_WIDTH), generator=generator) * mask, "attention_mask": mask}
    settings = dict(greedy=False, temperature=0.7, top_p=1.0, top_k=0, ignore_eos=False, max_new_tokens=NEW_TOKENS)
    torch.manual_seed(1)
    rows = rollout.generate(prompts, Sampling(**{**settings, **sampling}))
    return model, rows


def _recomputed(model, rows, temperature: float) -> torch.Tensor:
    from engine.workers.passes.logprob import response_log_probs

    with torch.no_grad():
        return response_log_probs(model, rows, temperature)[0]


def test_with_temperature_alone_they_are_the_trainers_log_probs(tiny_model_dir) -> None:
    model, rows = _generate(tiny_model_dir)
    mask = rows["response_mask"].bool()
    assert mask.sum() > 6  # tokens were sampled
    recomputed = _recomputed(model, rows, 0.7)
    assert torch.allclose(rows["rollout_log_probs"][mask], recomputed[mask], atol=1e-5)
    assert (rows["rollout_log_probs"][~mask] == 0).all()  # after the end: 0, never -inf or nan


def test_top_k_renormalizes_over_the_kept_tokens(tiny_model_dir) -> None:
    """With top-k the sampled distribution is the softmax over the k largest: each sampled token's
    log-prob is its temperature log-prob minus the log of the k tokens' total probability."""
    model, rows = _generate(tiny_model_dir, top_k=3)
    mask = rows["response_mask"].bool()
    recomputed = _recomputed(model, rows, 0.7)
    got = rows["rollout_log_probs"]
    assert torch.isfinite(got).all()
    assert (got[mask] >= recomputed[mask] - 1e-6).all()
    assert (got[mask] > recomputed[mask] + 1e-3).any()  # renormalized, so not the full distribution's
    # by hand for the first sampled token of row 0: the top 3 temperature logits' log-sum-exp
    from engine.batch import position_ids_from_mask

    prompt = {"input_ids": rows["input_ids"][:1, :PROMPT_WIDTH], "attention_mask": rows["attention_mask"][:1, :PROMPT_WIDTH]}
    with torch.no_grad():
        logits = model(**prompt, position_ids=position_ids_from_mask(prompt["attention_mask"])).logits[0, -1] / 0.7
    top = logits.topk(3).values
    token = rows["responses"][0, 0]
    assert float(got[0, 0]) == pytest.approx(float(logits[token] - torch.logsumexp(top, 0)), abs=1e-5)
    assert math.isfinite(float(got[0, 0]))


def test_greedy_rows_carry_log_probs_too(tiny_model_dir) -> None:
    model, rows = _generate(tiny_model_dir, greedy=True, temperature=1.0)
    mask = rows["response_mask"].bool()
    assert torch.allclose(rows["rollout_log_probs"][mask], _recomputed(model, rows, 1.0)[mask], atol=1e-5)


def test_asked_for_none_it_samples_the_same_tokens_without_them(tiny_model_dir) -> None:
    """rollout.calculate_log_probs false (and nothing reading them): no recorder runs, and the tokens sampled with
    the same seed are the ones sampled with it."""
    _, with_them = _generate(tiny_model_dir)
    _, without = _generate(tiny_model_dir, log_probs=False)
    assert "rollout_log_probs" in with_them and "rollout_log_probs" not in without
    assert torch.equal(with_them["responses"], without["responses"])
    assert torch.equal(with_them["response_mask"], without["response_mask"])
