"""GSM8K rule reward, following verl's `verl/utils/reward_score/gsm8k.py`.

The model is asked to put its final answer after "####". Two extraction modes:

* strict: the LAST "#### <number>" in the response (what the prompt asks for);
* flexible: the last number anywhere in the response (for models that ignore
  the format; useful to separate "wrong maths" from "wrong format").

Scores: `score` (1.0) if the extracted number equals the ground truth,
`format_score` (0.0 by default) if a number was extracted but is wrong, 0.0 if
nothing could be extracted. Unlike verl's plain string compare, "72.0", "72."
and "72" are treated as equal (a numeric normalisation), because penalising
that spelling difference only adds reward noise.
"""

from __future__ import annotations

import re

# Only the tail is searched, like verl, so huge rambling outputs stay cheap.
_CLIP_CHARS = 300
_STRICT = re.compile(r"#### ?(-?[0-9.,]+)")
_FLEXIBLE = re.compile(r"(-?[0-9.,]+)")


def _normalize_number(text: str) -> str:
    """Drop thousands separators, "$", a trailing period and a zero fraction."""
    out = text.replace(",", "").replace("$", "").rstrip(".")
    if re.fullmatch(r"-?\d+\.0+", out):
        out = out.split(".")[0]
    if out in ("-0",):
        out = "0"
    return out


def extract_solution(solution_str: str, method: str = "strict") -> str | None:
    """Return the normalised final answer of a response, or None if there is none.

    Args:
        method: "strict" (last "#### n") or "flexible" (last number anywhere).
    """
    if method not in ("strict", "flexible"):
        raise ValueError(f"method must be 'strict' or 'flexible', got {method!r}")
    tail = solution_str[-_CLIP_CHARS:]
    pattern = _STRICT if method == "strict" else _FLEXIBLE
    # Skip matches made only of separators (".", ","), which are not numbers.
    candidates = [m for m in pattern.findall(tail) if re.search(r"\d", m)]
    if not candidates:
        return None
    return _normalize_number(candidates[-1])


def compute_score(
    solution_str: str,
    ground_truth: str,
    method: str = "strict",
    format_score: float = 0.0,
    score: float = 1.0,
) -> float:
    """Score a GSM8K response against the ground-truth number (see module docstring)."""
    answer = extract_solution(solution_str, method=method)
    if answer is None:
        return 0.0
    return score if answer == _normalize_number(str(ground_truth).strip()) else format_score
