"""The reward both sides of bench/verl_side_by_side.py read: the synthetic echo task's score, in verl's
custom reward signature (reward.custom_reward_function.path / .name = compute_score).

Plain Python on purpose: verl imports this file in its reward-loop workers and rlconf in its
controller, so it must not import either project.
"""

from __future__ import annotations


def compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs):
    """1.0 when the response starts with the target word, 0.5 when it names it elsewhere, else 0.0."""
    text = (solution_str or "").strip().lower()
    target = str(ground_truth).strip().lower()
    if text.startswith(target):
        return 1.0
    return 0.5 if target in text else 0.0
