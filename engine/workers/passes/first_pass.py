"""π_old's metrics taken by the actor's update itself, when no separate pass computed π_old.

With `old_log_probs` "update" (one optimizer step) or "rollout" (bypass mode) the trainer runs no
old-log-prob pass, so the metrics that pass gave — the sampling policy's entropy, the gap between
the rollout engine's log-probs and the trainer's, the truncated IS weights — come from the update's
first pass over this rank's rows. With one optimizer step that pass runs at π_old exactly; in
bypass mode with several mini batches the later ones see a policy already moved by the first.
"""

from __future__ import annotations

import torch

from engine.algos.advantages import masked_mean
from engine.algos.rollout_correction import log_prob_gap_metrics, rollout_is_metrics


class FirstPassMetrics:
    """Collects each micro batch's detached values until every one of the rank's `rows` was seen once."""

    def __init__(self, rows: int, is_threshold: float | None) -> None:
        self.rows, self.is_threshold = rows, is_threshold
        self.seen = 0
        self.parts: dict[str, list[torch.Tensor]] = {}

    def add(self, response_mask: torch.Tensor, log_probs: torch.Tensor, entropy: torch.Tensor | None,
            rollout_log_probs: torch.Tensor | None, is_weights: torch.Tensor | None) -> None:
        if self.seen >= self.rows:  # a later epoch or mini batch: the rows were measured already
            return
        self.seen += response_mask.shape[0]
        valid = response_mask.bool()
        # Only the valid tokens: micro batches may be cut to different response widths.
        for name, value in (("log_probs", log_probs), ("entropy", entropy), ("rollout_log_probs", rollout_log_probs),
                            ("is_weights", is_weights)):
            if value is not None:
                self.parts.setdefault(name, []).append(value.detach()[valid].float().cpu())

    def metrics(self) -> dict[str, float]:
        if not self.parts:
            return {}
        rows = {name: torch.cat(values) for name, values in self.parts.items()}
        mask = torch.ones_like(rows["log_probs"])
        out: dict[str, float] = {}
        if "entropy" in rows:
            out["actor/entropy"] = float(masked_mean(rows["entropy"], mask))
        if "rollout_log_probs" in rows:
            out.update(log_prob_gap_metrics(rows["log_probs"], rows["rollout_log_probs"], mask))
        if "is_weights" in rows and self.is_threshold is not None:
            out.update(rollout_is_metrics(rows["is_weights"], mask, self.is_threshold))
        return out
