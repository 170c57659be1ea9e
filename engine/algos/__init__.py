"""Pure tensor algorithms for PPO/GRPO post-training (verl-compatible semantics).

Everything here is side-effect free: no I/O, no globals, no device placement.
"""

from engine.algos.advantages import (
    compute_gae,
    compute_grpo_advantages,
    compute_reinforce_plus_plus_advantages,
    compute_rloo_advantages,
    masked_mean,
    masked_var,
    masked_whiten,
    outcome_token_scores,
)
from engine.algos.kl import (
    AdaptiveKLController,
    FixedKLController,
    apply_kl_in_reward,
    kl_penalty,
)
from engine.algos.losses import (
    LOSS_AGG_MODES,
    PolicyLossOutput,
    agg_loss,
    entropy_from_logits,
    entropy_from_logits_chunked,
    log_probs_from_logits,
    policy_loss,
    value_loss,
)

__all__ = [
    "LOSS_AGG_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "PolicyLossOutput",
    "agg_loss",
    "apply_kl_in_reward",
    "compute_gae",
    "compute_grpo_advantages",
    "compute_reinforce_plus_plus_advantages",
    "compute_rloo_advantages",
    "entropy_from_logits",
    "entropy_from_logits_chunked",
    "kl_penalty",
    "log_probs_from_logits",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "outcome_token_scores",
    "policy_loss",
    "value_loss",
]
