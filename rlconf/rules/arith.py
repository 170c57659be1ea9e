"""Small helpers that turn a failed divisibility check into concrete suggestions."""

from __future__ import annotations


def divisors(n: int) -> list[int]:
    if n <= 0:
        return []
    small = [d for d in range(1, int(n**0.5) + 1) if n % d == 0]
    return sorted(set(small + [n // d for d in small]))


def nearest_divisors(n: int, around: int, count: int = 3) -> list[int]:
    """Divisors of `n` closest to `around` (ties prefer the larger), in ascending order."""
    ranked = sorted(divisors(n), key=lambda d: (abs(d - around), -d))
    return sorted(ranked[:count])


def nearest_multiples(of: int, around: int, count: int = 2) -> list[int]:
    """Positive multiples of `of` closest to `around`, ascending."""
    if of <= 0:
        return []
    low = max(of, (around // of) * of)
    candidates = {low, low + of}
    if low - of > 0:
        candidates.add(low - of)
    return sorted(sorted(candidates, key=lambda m: (abs(m - around), m))[:count])


def or_list(values: list[int]) -> str:
    words = [str(v) for v in values]
    if len(words) <= 1:
        return "".join(words)
    return ", ".join(words[:-1]) + " or " + words[-1]
