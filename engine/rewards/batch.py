"""Score a step's decoded responses with the plan's reward function (verl's naive reward manager)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from engine.rewards.registry import default_compute_score, load_custom_reward_function
from rlconf.schema.sections import CustomRewardFunction

ScoreFn = Callable[..., Any]


def reward_function(custom: CustomRewardFunction) -> ScoreFn:
    if custom.path:
        return load_custom_reward_function(custom.path, custom.name)
    return default_compute_score


def score_responses(score_fn: ScoreFn, responses: Sequence[str], data_sources: Sequence[str],
                    ground_truths: Sequence[str], extra_infos: Sequence[dict[str, Any]]) -> list[float]:
    scores = []
    for text, source, truth, extra in zip(responses, data_sources, ground_truths, extra_infos, strict=True):
        score = score_fn(data_source=source, solution_str=text, ground_truth=truth, extra_info=extra)
        # verl allows a dict result with the scalar under "score" (and extra logging fields).
        scores.append(float(score["score"] if isinstance(score, dict) else score))
    return scores
