"""The reward model's own rules (reward_model.enable): what it needs, and what it replaces in the reward.

rlconf runs the tuning guide's reward model as a FSDP scorer (engine/workers/roles/reward_model.py):
its score at the last token of each (prompt, response) is the reward. As verl's reward managers do
when reward-model scores exist, the rule scorer (custom_reward_function, the data source's scorer)
and DAPO's overlong penalty do not enter that reward.

Without reward_model.model.input_tokenizer the worker reads the policy's token ids as they are (as verl's
does when input_tokenizer is null), so the two models must share a vocabulary: an id the policy samples
that the reward model has no embedding row for stops the run (on a GPU, a device-side assert).
"""

from __future__ import annotations

from collections.abc import Iterator

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.modelinfo import ModelInfo, source_text
from rlconf.normalize import Normalized
from rlconf.schema import PlanConfig


def check_reward_model(plan: PlanConfig, norm: Normalized, policy: ModelInfo | None = None,
                       reward: ModelInfo | None = None) -> Iterator[Diagnostic]:
    """`policy`, `reward`: what rlconf knows of actor_rollout_ref.model.path and reward_model.model.path."""
    rm = plan.reward_model
    if not rm.enable:
        return
    if not rm.model.path:
        yield error("RL531", "reward_model.model.path",
                    "reward_model.enable is true, but reward_model.model.path names no model to score with",
                    help="set reward_model.model.path to a reward model (a sequence- or token-classification "
                         "checkpoint with one label), e.g. `tiny://qwen2-reward` for a CPU dry run")
    replaced = []
    if plan.custom_reward_function.path:
        replaced.append(f"custom_reward_function ({plan.custom_reward_function.path})")
    if rm.reward_manager in ("batch", "prime"):
        replaced.append(f"the {rm.reward_manager} reward manager's scoring")
    if rm.reward_manager == "dapo" and rm.reward_kwargs.overlong_buffer_cfg and rm.reward_kwargs.overlong_buffer_cfg.enable:
        replaced.append("the dapo overlong penalty")
    if replaced:
        yield warning("RL532", "reward_model.enable",
                      f"with reward_model.enable the reward model's scores are the reward: {' and '.join(replaced)} "
                      "will not be applied (verl's reward managers return the model's scores as they are)",
                      help="turn the reward model off to reward with rules, or drop what it replaces")
    yield from _vocabularies(plan, norm, policy, reward)


PADDED_VOCAB_SLACK = 0.01  # a vocabulary within 1% of the other's: the same tokenizer, padded apart


def _vocabularies(plan: PlanConfig, norm: Normalized, policy: ModelInfo | None,
                  reward: ModelInfo | None) -> Iterator[Diagnostic]:
    """RL534: the FSDP worker fed the policy's ids by a reward model of another vocabulary size.

    Silent where either size is unknown (a hub name whose config.json rlconf cannot read), where the
    reward model is served (the reward loop scores text: decoded and re-tokenized), and where
    input_tokenizer re-tokenizes the responses for it."""
    rm = plan.reward_model
    if norm.reward_model is None or rm.model.input_tokenizer:
        return
    policy_vocab = policy.vocab_size if policy is not None else None
    reward_vocab = reward.vocab_size if reward is not None else None
    if not policy_vocab or not reward_vocab or policy_vocab == reward_vocab:
        return
    policy_path = plan.actor_rollout_ref.model.path
    note = (f"vocab_size: reward model {reward_vocab:,} ({source_text(reward)}), "
            f"policy {policy_vocab:,} ({source_text(policy)})")
    fix = (f"set `reward_model.model.input_tokenizer: {policy_path}` (the policy's path, verl's default for this key; "
           "rlconf's is null): each response is decoded with the policy's tokenizer, re-rendered in the reward "
           "model's chat template and re-tokenized with its tokenizer")
    # One tokenizer's models may pad their embeddings to different sizes (Qwen2.5: 151,936 rows up to 3B, 152,064
    # from 7B, for 151,665 tokens): rows that close are padding, which a trained policy almost never samples.
    padding = abs(policy_vocab - reward_vocab) <= PADDED_VOCAB_SLACK * max(policy_vocab, reward_vocab)
    if padding:
        yield warning("RL534", "reward_model.model.path",
                      f"the reward model `{rm.model.path}` has {reward_vocab:,} token embeddings and the policy "
                      f"`{policy_path}` {policy_vocab:,}: a difference this small is usually one tokenizer's padding "
                      "(Qwen2.5 pads to 151,936 up to 3B and to 152,064 from 7B), but without "
                      "reward_model.model.input_tokenizer the reward model reads the policy's token ids as they are"
                      + (f", and a sampled id of {reward_vocab:,} or more (a padding row) stops the run"
                         if reward_vocab < policy_vocab else ""),
                      help=fix + "; leave it unset where both models share one tokenizer", note=note)
    elif reward_vocab < policy_vocab:
        yield error("RL534", "reward_model.model.path",
                    f"the reward model `{rm.model.path}` has {reward_vocab:,} token embeddings and the policy "
                    f"`{policy_path}` samples from {policy_vocab:,}: without reward_model.model.input_tokenizer the "
                    f"reward-model worker reads the policy's token ids as they are, and an id of {reward_vocab:,} or "
                    "more has no row in its embedding (on a GPU, a device-side assert in the middle of the run)",
                    help=fix + "; or use a reward model built on the policy's tokenizer", note=note)
    else:
        yield warning("RL534", "reward_model.model.path",
                      f"the reward model `{rm.model.path}` has {reward_vocab:,} token embeddings and the policy "
                      f"`{policy_path}` {policy_vocab:,}: their tokenizers likely differ, and without "
                      "reward_model.model.input_tokenizer the reward model reads the policy's token ids as ids of "
                      "its own vocabulary: it would score other tokens than the policy wrote",
                      help=fix + "; leave it unset only where both models share one tokenizer", note=note)
