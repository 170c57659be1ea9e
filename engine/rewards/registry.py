"""Reward dispatch by data_source, and loading of user-supplied reward functions.

`default_compute_score` has verl's signature (data_source, solution_str,
ground_truth, extra_info) so configs written for verl's
`custom_reward_function` hook work unchanged here, and vice versa.
"""

from __future__ import annotations

import hashlib
import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from engine.data.gsm8k import DATA_SOURCE as GSM8K_SOURCE
from engine.data.synthetic import DATA_SOURCE as SYNTHETIC_SOURCE
from engine.rewards import gsm8k, math_boxed, synthetic

ScoreFn = Callable[[str, str], float]

# data_source -> scorer. The MATH aliases are the names verl's own dispatch accepts.
_SCORERS: dict[str, ScoreFn] = {
    GSM8K_SOURCE: gsm8k.compute_score,
    "lighteval/MATH": math_boxed.compute_score,
    "DigitalLearningGmbH/MATH-lighteval": math_boxed.compute_score,
    "math": math_boxed.compute_score,
    SYNTHETIC_SOURCE: synthetic.compute_score,
}
KNOWN_DATA_SOURCES: tuple[str, ...] = tuple(_SCORERS)


class UnknownDataSourceError(NotImplementedError):
    """No built-in reward for a data_source.

    Subclasses NotImplementedError because that is what verl raises here, so
    callers written against verl keep catching it.
    """


def default_compute_score(
    data_source: str,
    solution_str: str,
    ground_truth: str,
    extra_info: dict[str, Any] | None = None,
) -> float:
    """Score one decoded response with the built-in rule reward for its data_source.

    `extra_info` is accepted for verl signature compatibility; built-in scorers
    do not need it.
    """
    del extra_info  # unused by built-ins; part of the verl-compatible signature
    scorer = _SCORERS.get(data_source)
    if scorer is None:
        raise UnknownDataSourceError(
            f"no built-in reward for data_source={data_source!r}; known data sources: "
            f"{', '.join(KNOWN_DATA_SOURCES)}. Set custom_reward_function.path/name "
            "to score other datasets."
        )
    return float(scorer(solution_str, ground_truth))


def load_custom_reward_function(path: str | Path, name: str) -> Callable[..., Any]:
    """Import the Python file at `path` and return its callable attribute `name`.

    Raises:
        FileNotFoundError: `path` does not exist or is not a file.
        ImportError: the file cannot be imported (its own exception is chained).
        AttributeError: the module has no attribute `name`.
        TypeError: the attribute exists but is not callable.
    """
    file = Path(path).expanduser().resolve()
    if not file.is_file():
        raise FileNotFoundError(f"custom reward file not found: {file}")
    # A per-path module name: two different files called reward.py must not
    # overwrite each other in sys.modules.
    module_name = f"rlconf_custom_reward_{hashlib.sha1(str(file).encode()).hexdigest()[:12]}"
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot import custom reward file {file} (not a Python module?)")
    module = importlib.util.module_from_spec(spec)
    # Registered before exec so pickling (e.g. shipping the function to Ray
    # workers) and dataclasses inside the user file can resolve the module.
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        sys.modules.pop(module_name, None)
        raise ImportError(f"error while importing custom reward file {file}: {exc!r}") from exc
    if not hasattr(module, name):
        public = sorted(n for n in vars(module) if not n.startswith("_") and callable(getattr(module, n)))
        raise AttributeError(
            f"custom reward function {name!r} not found in {file}; callables defined there: {public}"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise TypeError(f"{name!r} in {file} is a {type(fn).__name__}, not a callable")
    return fn
