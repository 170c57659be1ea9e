"""Reward for the synthetic echo task (engine.data.synthetic).

1.0 if the stripped response starts with the target word (i.e. the first
generated token is the target: every target is a single token of the tiny
tokenizer), 0.5 if the target appears anywhere else in the response, else 0.0.
The partial credit keeps the reward dense enough that a random-weight policy
gets signal from the first step; starting with the target is what gets full
credit, so the optimum is unchanged. Responses need not end after the word
because tiny models rarely learn EOS within a short smoke run.
"""

from __future__ import annotations

FULL_CREDIT = 1.0
PARTIAL_CREDIT = 0.5


def compute_score(solution_str: str, ground_truth: str) -> float:
    """Score one response of the echo task against its target word."""
    target = str(ground_truth).strip().lower()
    if not target:
        raise ValueError("synthetic ground_truth must be a non-empty word")
    response = solution_str.strip().lower()
    if response.startswith(target):
        return FULL_CREDIT
    if target in response:
        return PARTIAL_CREDIT
    return 0.0
