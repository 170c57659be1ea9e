"""Dynamic batch size / token budget rules (RL4xx).

verl utils/seqlen_balancing.py `rearrange_micro_batches` asserts that the token budget
(`*_max_token_len_per_gpu × ulysses sp`) holds the longest padded sequence
(max_prompt_length + max_response_length); verl only finds out mid-step. We check up front.
"""

from __future__ import annotations

from collections.abc import Iterator

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.normalize import ForwardPass, Normalized, TrainPass
from rlconf.schema import PlanConfig

TOKEN_KEYS = {
    ("actor", True): "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    ("rollout", False): "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu",
    ("ref", False): "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu",
    ("critic", True): "critic.ppo_max_token_len_per_gpu",
    ("critic", False): "critic.forward_max_token_len_per_gpu",
    ("reward_model", False): "reward_model.forward_max_token_len_per_gpu",
}


def _passes(norm: Normalized) -> list[tuple[TrainPass | ForwardPass, bool]]:
    out: list[tuple[TrainPass | ForwardPass, bool]] = [(norm.actor, True)]
    if norm.rollout.log_prob is not None:
        out.append((norm.rollout.log_prob, False))
    for fwd in (norm.ref, norm.critic_values, norm.reward_model):
        if fwd is not None:
            out.append((fwd, False))
    if norm.critic is not None:
        out.append((norm.critic, True))
    return out


# A forward budget left unset inherits another key's value (see normalize); a too-small value is
# reported once, at the key that holds it, not again for every pass that inherits it.
INHERITS_FROM = {
    "actor_rollout_ref.rollout.log_prob_max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "actor_rollout_ref.ref.log_prob_max_token_len_per_gpu": "actor_rollout_ref.actor.ppo_max_token_len_per_gpu",
    "critic.forward_max_token_len_per_gpu": "critic.ppo_max_token_len_per_gpu",
    "reward_model.forward_max_token_len_per_gpu": "critic.forward_max_token_len_per_gpu",
}


def _holding_key(plan: PlanConfig, key: str) -> str:
    """The key whose value a budget actually uses, following unset keys to what they inherit."""
    while key in INHERITS_FROM and _get(plan, key) is None:
        key = INHERITS_FROM[key]
    return key


def _get(plan: PlanConfig, dotted: str):
    node = plan
    for part in dotted.split("."):
        node = getattr(node, part)
    return node


def check_token_budgets(plan: PlanConfig, norm: Normalized) -> Iterator[Diagnostic]:
    seq_len = norm.rollout.prompt_length.value + norm.rollout.response_length.value
    reported: set[str] = set()
    for p, training in _passes(norm):
        if not p.use_dynamic_bsz:
            continue
        key = _holding_key(plan, TOKEN_KEYS[(p.role, training)])
        if key in reported:
            continue
        reported.add(key)
        budget = p.max_token_len_per_gpu.value
        if budget * p.sp_size < seq_len:
            need = -(-seq_len // p.sp_size)
            yield error("RL401", key,
                        f"{p.role} token budget {budget} per GPU cannot hold one full sequence of {seq_len} tokens",
                        note=f"{budget} × sp {p.sp_size} = {budget * p.sp_size} < prompt {norm.rollout.prompt_length.value} + response {norm.rollout.response_length.value}",
                        help=f"use at least {need} (2× = {2 * need} is the tuning guide's floor for training)")
        elif training and p.role == "actor" and budget * p.sp_size < 2 * seq_len:
            yield warning("RL402", key,
                          f"actor ppo_max_token_len_per_gpu {budget} is under 2 × (prompt + response) = {2 * seq_len}: micro batches will hold one or two sequences",
                          help=f"raise it to at least {-(-2 * seq_len // p.sp_size)} (the tuning guide suggests 2-3×) for throughput")
    arr = plan.actor_rollout_ref
    for dynamic, per_gpu, key in (
        (norm.actor.use_dynamic_bsz, arr.actor.ppo_micro_batch_size_per_gpu, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
        (norm.critic.use_dynamic_bsz if norm.critic else False, plan.critic.ppo_micro_batch_size_per_gpu, "critic.ppo_micro_batch_size_per_gpu"),
    ):
        if dynamic and per_gpu is not None:
            yield warning("RL403", key, f"`{key.rpartition('.')[2]}` {per_gpu} is ignored: use_dynamic_bsz packs micro batches by token budget",
                          help="remove it, or tune *_max_token_len_per_gpu instead")
