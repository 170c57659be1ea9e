"""MATH-style rule reward: compare the last \\boxed{...} of a response to the ground truth.

Follows verl's `verl/utils/reward_score/math.py` (Hendrycks MATH conventions):
the answer is the content of the LAST \\boxed{...} (braces balanced, so nested
\\frac{..}{..} work; "\\boxed 5" and \\fbox{} are accepted too), both sides are
normalised, and the score is 1.0 on a match, else 0.0. Normalisation is
deliberately modest (string rewrites plus an exact rational comparison for plain
numbers and a/b fractions): a wrong "equal" is worse for RL than a missed one.
"""

from __future__ import annotations

import re
from fractions import Fraction


def last_boxed_only_string(text: str) -> str | None:
    """Return the last "\\boxed{...}" (or "\\fbox{...}", "\\boxed x") substring, or None."""
    idx = max(text.rfind("\\boxed"), text.rfind("\\fbox"))
    if idx < 0:
        return None
    if text.startswith("\\boxed ", idx):
        # "\boxed 5$" form: the answer runs to the next "$" or the end.
        return "\\boxed " + text[idx + len("\\boxed ") :].split("$")[0]
    depth = 0
    for pos in range(idx, len(text)):
        if text[pos] == "{":
            depth += 1
        elif text[pos] == "}":
            depth -= 1
            if depth == 0:
                return text[idx : pos + 1]
    return None  # unbalanced: the model stopped mid-answer


def remove_boxed(boxed: str) -> str:
    """Strip the "\\boxed{" ... "}" wrapper returned by last_boxed_only_string."""
    for prefix in ("\\boxed ", "\\boxed{", "\\fbox{"):
        if boxed.startswith(prefix):
            inner = boxed[len(prefix) :]
            return inner if prefix.endswith(" ") else inner[:-1]
    raise ValueError(f"not a boxed expression: {boxed!r}")


def extract_boxed_answer(text: str) -> str | None:
    """Content of the last \\boxed{...} in `text`, or None."""
    boxed = last_boxed_only_string(text)
    return remove_boxed(boxed) if boxed is not None else None


def _braced(text: str, start: int) -> tuple[str, int] | None:
    """Parse "{...}" (balanced) or a single character at `start`; return (content, end)."""
    if start >= len(text):
        return None
    if text[start] != "{":
        return text[start], start + 1  # "\frac12" shorthand
    depth = 0
    for pos in range(start, len(text)):
        depth += {"{": 1, "}": -1}.get(text[pos], 0)
        if depth == 0:
            return text[start + 1 : pos], pos + 1
    return None


def _frac_to_slash(text: str) -> str:
    """Rewrite \\frac{a}{b} as a/b (parenthesised when a or b is not atomic)."""
    out, pos = [], 0
    while (idx := text.find("\\frac", pos)) >= 0:
        num = _braced(text, idx + len("\\frac"))
        den = _braced(text, num[1]) if num else None
        if num is None or den is None:
            break
        parts = [p if re.fullmatch(r"-?[\w.]+", p) else f"({p})" for p in (num[0], den[0])]
        out.append(text[pos:idx] + f"{parts[0]}/{parts[1]}")
        pos = den[1]
    return "".join(out) + text[pos:]


def normalize_answer(answer: str) -> str:
    """Canonical string form of a MATH answer (spaces, units, \\left/\\right, fractions...)."""
    s = answer.strip().replace("\n", "").replace("\\!", "")
    s = s.replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\^\{?\\circ\}?", "", s)  # degrees
    s = s.replace("\\$", "").replace("$", "").replace("\\%", "").replace("%", "")
    s = re.sub(r"\\(?:text|mathrm|mbox)\{([^{}]*)\}", r"\1", s)  # unwrap text, keep content
    s = s.replace(" ", "")
    s = re.sub(r"\\sqrt(\w)", r"\\sqrt{\1}", s)
    s = _frac_to_slash(s)
    # "x=5" / "k = 3": keep the value when the left side is a short variable name.
    if s.count("=") == 1 and len(s.split("=")[0]) <= 2:
        s = s.split("=")[1]
    s = re.sub(r"(?<![\d.])\.(\d)", r"0.\1", s)  # ".5" -> "0.5"
    s = re.sub(r"^(-?\d+)\.0+$", r"\1", s)  # "5.0" -> "5"
    s = s.rstrip(".")
    return s


def _as_fraction(s: str) -> Fraction | None:
    """Exact value of "3", "-0.25", "1,000", "1/2" or "(1)/(2)"; None for anything else.

    Patterns are matched whole so tuples like "(1,2)" are never read as numbers.
    """
    num = r"-?\d+(?:\.\d+)?"
    if re.fullmatch(r"-?\d{1,3}(?:,\d{3})+(?:\.\d+)?", s):  # thousands separators
        s = s.replace(",", "")
    try:
        if re.fullmatch(num, s):
            return Fraction(s)
        if m := re.fullmatch(rf"\(?({num})\)?/\(?({num})\)?", s):
            return Fraction(m.group(1)) / Fraction(m.group(2))
    except ZeroDivisionError:
        return None
    return None


def is_equiv(answer: str, ground_truth: str) -> bool:
    """True if two answers are equal after normalisation (or as exact rationals)."""
    a, b = normalize_answer(answer), normalize_answer(ground_truth)
    if a == b:
        return True
    fa, fb = _as_fraction(a), _as_fraction(b)
    return fa is not None and fa == fb


def compute_score(solution_str: str, ground_truth: str) -> float:
    """1.0 if the last \\boxed{} answer matches `ground_truth`, else 0.0.

    A ground truth that itself contains \\boxed{...} (a full reference solution)
    is reduced to its boxed answer first.
    """
    answer = extract_boxed_answer(solution_str)
    if answer is None:
        return 0.0
    truth = str(ground_truth)
    if "\\boxed" in truth or "\\fbox" in truth:
        truth = extract_boxed_answer(truth) or truth
    return 1.0 if is_equiv(answer, truth) else 0.0
