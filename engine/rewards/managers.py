"""verl's reward managers (`reward_model.reward_manager`): how a step's decoded responses become rewards.

Each manager calls the plan's scorer (custom_reward_function, or the data source's built-in rule) its
own way, as verl's managers of the same names do (verl/workers/reward_manager):

- naive: once per response, `fn(data_source=, solution_str=, ground_truth=, extra_info=)`;
- dapo: as naive, plus DAPO's overlong penalty (engine.rewards.overlong) on the reward;
- batch: once per batch, `fn(data_sources=, solution_strs=, ground_truths=, extra_infos=)`, returning one
  score per response (the scorer sees the whole batch: a judge that batches, a group-level rule);
- prime: once per response, positionally `fn(data_source, solution_str, ground_truth, extra_info)`, in
  a process pool with a deadline (engine.rewards.timed_pool): a response whose scorer hangs, raises or
  crashes gets verl's fallback score 0.0 and is counted in `reward/scorer_timeouts` / `reward/scorer_errors`.

A score may be a number or a dict with "score" (verl's extra fields are not kept). With a reward
model, its scores are the reward and no manager is called, as in verl (engine.controller.stages).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.rewards.batch import ScoreFn, reward_function, score_responses
from engine.rewards.overlong import dapo_penalties
from engine.rewards.timed_pool import as_score, score_in_processes
from rlconf.rewards import PRIME_FALLBACK_SCORE, PRIME_PROCESSES, PRIME_TIMEOUT_S
from rlconf.schema.sections import CustomRewardFunction, RewardModelConfig

MANAGERS = ("naive", "dapo", "batch", "prime")


@dataclass(frozen=True)
class Responses:
    """A batch's decoded responses and what the scorer reads beside each."""

    texts: Sequence[str]
    data_sources: Sequence[str]
    ground_truths: Sequence[str]
    extra_infos: Sequence[dict[str, Any]]
    lengths: torch.Tensor  # [B] valid response tokens (the dapo penalty reads them)


@dataclass
class RewardManager:
    """One of verl's managers over the plan's scorer. Call it for (the scorer's scores, the rewards)."""

    name: str
    score_fn: ScoreFn
    reward_model: RewardModelConfig
    prime_processes: int = PRIME_PROCESSES
    prime_timeout_s: float = PRIME_TIMEOUT_S
    log: Callable[[str], None] = print
    counts: dict[str, float] = field(default_factory=dict)  # scorer timeouts / errors since take_metrics

    def __post_init__(self) -> None:
        if self.name not in MANAGERS:  # the compiler refuses the others (RL108)
            raise ValueError(f"reward_model.reward_manager={self.name}: this engine runs {', '.join(MANAGERS)}")

    def __call__(self, responses: Responses) -> tuple[list[float], torch.Tensor]:
        """(the scorer's score per response, the reward: the score plus dapo's overlong penalty where it applies)."""
        if self.name == "batch":
            scores = self._batch(responses)
        elif self.name == "prime":
            scores = self._prime(responses)
        else:
            scores = score_responses(self.score_fn, responses.texts, responses.data_sources, responses.ground_truths,
                                     responses.extra_infos)
        rewards = torch.tensor(scores, dtype=torch.float32)
        penalties = dapo_penalties(self.reward_model, responses.lengths) if self.name == "dapo" else None
        return scores, (rewards if penalties is None else rewards + penalties)

    def take_metrics(self) -> dict[str, float]:
        """The scorer's timeouts and errors counted since the last call (prime only; empty for the others)."""
        counts, self.counts = self.counts, {}
        return counts

    def _batch(self, responses: Responses) -> list[float]:
        results = self.score_fn(data_sources=list(responses.data_sources), solution_strs=list(responses.texts),
                                ground_truths=list(responses.ground_truths), extra_infos=list(responses.extra_infos))
        results = list(results)
        if len(results) != len(responses.texts):
            raise ValueError(f"the batch reward manager's scorer returned {len(results)} scores for "
                             f"{len(responses.texts)} responses; it must return one per response, in order")
        return [as_score(result) for result in results]

    def _prime(self, responses: Responses) -> list[float]:
        fn, texts = self.score_fn, responses.texts
        sources, truths, extras = responses.data_sources, responses.ground_truths, responses.extra_infos
        outcome = score_in_processes(lambda i: fn(sources[i], texts[i], truths[i], extras[i]), len(texts),
                                     self.prime_processes, self.prime_timeout_s)
        for index, error in sorted(outcome.failed.items())[:3]:  # a few, not one line per response of a bad batch
            self.log(f"reward: scoring response {index} failed ({error}); it gets {PRIME_FALLBACK_SCORE}")
        if outcome.timed_out:
            self.log(f"reward: {len(outcome.timed_out)} response(s) not scored within {self.prime_timeout_s:g} s; "
                     f"they get {PRIME_FALLBACK_SCORE}")
        self.counts["reward/scorer_timeouts"] = self.counts.get("reward/scorer_timeouts", 0) + len(outcome.timed_out)
        self.counts["reward/scorer_errors"] = self.counts.get("reward/scorer_errors", 0) + len(outcome.failed)
        return [PRIME_FALLBACK_SCORE if score is None else score for score in outcome.scores]


def build_reward_manager(reward_model: RewardModelConfig, custom: CustomRewardFunction,
                         log: Callable[[str], None] = print) -> RewardManager:
    """The plan's manager over its scorer (custom_reward_function, or the built-in rule of each data source)."""
    return RewardManager(reward_model.reward_manager, reward_function(custom), reward_model, log=log)
