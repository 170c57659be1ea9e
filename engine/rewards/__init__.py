"""Rule-based rewards (GSM8K, MATH \\boxed{}, synthetic echo) and their dispatch by data_source."""

from engine.rewards.registry import (
    KNOWN_DATA_SOURCES,
    UnknownDataSourceError,
    default_compute_score,
    load_custom_reward_function,
)

__all__ = [
    "KNOWN_DATA_SOURCES",
    "UnknownDataSourceError",
    "default_compute_score",
    "load_custom_reward_function",
]
