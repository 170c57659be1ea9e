"""docs/metrics.md documents every metric key the engine writes (found in the engine's source)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PREFIXES = ("actor", "critic", "reward", "response_length", "perf", "timing", "memory", "val", "kl_in_reward", "rollout",
            "dynamic_sampling", "rollout_corr", "offpolicy")
# A complete key as a string literal, e.g. "actor/grad_norm"; f-string patterns are documented by hand.
LITERAL_KEY = re.compile(r'"((?:%s)/[a-z_/]+)"' % "|".join(PREFIXES))
STAGE = re.compile(r'timer\.stage\("(\w+)"\)')
STARTUP_PHASE = re.compile(r'\.(?:phase|so_far)\("(\w+)"')  # engine.startup.StartupClock: timing/startup_<name>


def engine_metric_keys() -> set[str]:
    keys: set[str] = set()
    for path in (ROOT / "engine").rglob("*.py"):
        source = path.read_text()
        keys |= set(LITERAL_KEY.findall(source))
        keys |= {f"timing/{stage}" for stage in STAGE.findall(source)}
        keys |= {f"timing/startup_{phase}" for phase in STARTUP_PHASE.findall(source)}
    return keys


def test_every_metric_key_in_the_engine_is_in_docs_metrics_md():
    documented = (ROOT / "docs" / "metrics.md").read_text()
    keys = engine_metric_keys()
    assert {"actor/grad_norm", "timing/generate", "val/reward/mean"} <= keys  # the scan finds real keys
    missing = sorted(key for key in keys if f"`{key}`" not in documented)
    assert not missing, f"metric keys missing from docs/metrics.md: {missing}"
