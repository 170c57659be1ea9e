"""Differential test of rlconf against verl 0.9.1's own checks: which plans each side refuses, and the
per-GPU numbers where both accept. Not run in CI (verl is heavy); nothing is installed into rlconf's
environment: verl runs in a Python of its own, e.g.

    python3 -m venv /tmp/verlenv
    /tmp/verlenv/bin/pip install torch==2.13.0 verl==0.9.1 --no-deps
    /tmp/verlenv/bin/pip install packaging numpy 'tensordict>=0.8,<=0.10,!=0.9.0' hydra-core omegaconf pandas \
        ray 'transformers>=5.5.3,<5.11,!=5.6.0' codetiming datasets pillow
    python tools/verl_diff.py --verl-python /tmp/verlenv/bin/python tests/compiler/bad_plans presets

Each plan (a file, or the *.yaml of a directory; a second header line `# overrides: a=1 b=2` adds
command-line overrides, as in tests/compiler/bad_plans) goes through `rlconf explain --format json`
and, merged with its bases and with rlconf's own sections left out, through tools/verl_side.py in the
verl Python. A plan rlconf refuses and verl accepts is explained when every error has an audit entry
that says why verl's CPU checks do not see it (rlconf/rules/verl_audit.py); any other difference is
printed as a disagreement, and the exit code is 1.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# verl_side's number -> where `rlconf explain --format json` puts it (roles.<role>.<field>).
NUMBERS: dict[str, tuple[str, ...]] = {
    "actor.ppo_mini_batch_size_per_gpu": ("actor", "ppo_mini_batch_size_per_gpu"),
    "actor.ppo_micro_batch_size_per_gpu": ("actor", "ppo_micro_batch_size_per_gpu"),
    "rollout.log_prob.micro_batch_size_per_gpu": ("rollout", "log_prob", "micro_batch_size_per_gpu"),
    "ref.micro_batch_size_per_gpu": ("ref", "micro_batch_size_per_gpu"),
    "critic.ppo_mini_batch_size_per_gpu": ("critic", "ppo_mini_batch_size_per_gpu"),
    "critic.ppo_micro_batch_size_per_gpu": ("critic", "ppo_micro_batch_size_per_gpu"),
    "critic.values.micro_batch_size_per_gpu": ("critic_values", "micro_batch_size_per_gpu"),
}


@dataclass
class RlconfSide:
    valid: bool
    errors: list[str]  # codes
    roles: dict[str, Any] = field(default_factory=dict)
    verl_values: dict[str, Any] | None = None  # None: rlconf could not read the plan, verl is not asked
    placement: bool = False  # rlconf's pools: verl's side puts every role on the whole cluster


@dataclass
class Outcome:
    plan: str
    kind: str  # "agree", "explained", "disagree", "not compared"
    detail: str = ""


def plan_files(paths: list[Path]) -> list[Path]:
    found: list[Path] = []
    for path in paths:
        found += sorted(p for p in path.glob("*.yaml") if p.is_file()) if path.is_dir() else [path]
    return found


def header_overrides(path: Path) -> list[str]:
    for line in path.read_bytes().split(b"\n")[:2]:
        if line.startswith(b"# overrides:"):
            return line.decode("utf-8", "replace")[len("# overrides:"):].split()
    return []


def _flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(node, dict) and node:
        out: dict[str, Any] = {}
        for key, value in node.items():
            out.update(_flatten(value, f"{prefix}{key}."))
        return out
    return {prefix[:-1]: node}


def verl_values(data: dict[str, Any]) -> dict[str, Any]:
    """The plan's own values under verl 0.9.1's key names, without rlconf's sections and keys."""
    from rlconf.schema.verl_compat import ALIASES, RLCONF_ONLY

    to_verl = {mine: theirs for theirs, mine in ALIASES.items()}
    out: dict[str, Any] = {}
    for key, value in _flatten({k: v for k, v in data.items() if k != "base"}).items():
        if key not in to_verl and any(key == only or key.startswith(only + ".") for only in RLCONF_ONLY):
            continue
        out[to_verl.get(key, key)] = value
    return out


def rlconf_side(path: Path) -> RlconfSide:
    from rlconf.loader import load_plan

    overrides = header_overrides(path)
    proc = subprocess.run([sys.executable, "-m", "rlconf", "explain", str(path), *overrides, "--format", "json"],
                          capture_output=True, text=True, cwd=REPO, timeout=120)
    payload = json.loads(proc.stdout)
    errors = [d["code"] for d in payload.get("diagnostics", []) if d["severity"] == "error"]
    try:
        data = load_plan(path, overrides).data
        values, placement = verl_values(data), bool(data.get("placement"))
        json.dumps(values)
    except Exception:  # unreadable YAML, a base that is missing, a value JSON cannot carry: nothing to hand verl
        values, placement = None, False
    return RlconfSide("roles" in payload, errors, payload.get("roles", {}), values, placement)


def verl_side(verl_python: str, plans: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """tools/verl_side.py's verdict on each plan, run once for all of them in the verl Python."""
    request = json.dumps([{"name": name, "values": values} for name, values in plans.items()])
    with tempfile.TemporaryDirectory() as scratch:  # a neutral cwd: nothing of rlconf's on verl's path
        proc = subprocess.run([verl_python, str(REPO / "tools" / "verl_side.py")], input=request, capture_output=True,
                              text=True, cwd=scratch, timeout=1800)
    if proc.returncode != 0:
        raise SystemExit(f"the verl side failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    return {row["name"]: row for row in json.loads(proc.stdout)}


def _rlconf_number(roles: dict[str, Any], where: tuple[str, ...]) -> Any:
    node: Any = roles
    for part in where:
        if not isinstance(node, dict):
            return None
        node = node.get(part)
    return node


def compare(plan: str, mine: RlconfSide, verl: dict[str, Any] | None) -> Outcome:
    """One plan's outcome; the audit explains a refusal of rlconf's that verl's CPU checks do not make."""
    outcome = _compare(plan, mine, verl)
    if mine.placement and outcome.kind == "disagree":
        return Outcome(plan, "explained", "placement (rlconf's) gives roles pools of their own, and verl's side runs "
                                          f"every role on all the cluster's GPUs ({outcome.detail})")
    return outcome


def _compare(plan: str, mine: RlconfSide, verl: dict[str, Any] | None) -> Outcome:
    from rlconf.rules.verl_audit import AUDIT, REFUSED_BY_VERL

    if verl is None:
        return Outcome(plan, "not compared", f"rlconf cannot read it ({', '.join(mine.errors)}); neither can verl")
    if mine.valid and verl["valid"]:
        differ = [f"{name}: rlconf {_rlconf_number(mine.roles, NUMBERS[name])}, verl {value}"
                  for name, value in verl["numbers"].items() if _rlconf_number(mine.roles, NUMBERS[name]) != value]
        return Outcome(plan, "disagree" if differ else "agree", "; ".join(differ))
    if not mine.valid and not verl["valid"]:
        return Outcome(plan, "agree", f"both refuse: rlconf {' '.join(sorted(set(mine.errors)))}; verl {verl['error']}")
    if mine.valid:
        return Outcome(plan, "disagree", f"verl refuses what rlconf accepts: {verl['error']}")
    codes = sorted(set(mine.errors))
    unexplained = [code for code in codes if code not in AUDIT or AUDIT[code].verdict == REFUSED_BY_VERL]
    if unexplained:
        return Outcome(plan, "disagree", f"rlconf refuses ({' '.join(codes)}) what verl accepts; "
                                         f"no audit reason for {' '.join(unexplained)}")
    return Outcome(plan, "explained", "; ".join(f"{code}: {AUDIT[code].verdict}" for code in codes))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("plans", nargs="+", type=Path, help="plan files or directories of them")
    parser.add_argument("--verl-python", required=True, help="a Python with verl 0.9.1 (e.g. /tmp/verlenv/bin/python)")
    args = parser.parse_args(argv)
    files = plan_files(args.plans)
    mine = {str(path): rlconf_side(path) for path in files}
    verdicts = verl_side(args.verl_python, {name: side.verl_values for name, side in mine.items()
                                            if side.verl_values is not None})
    outcomes = [compare(name, side, verdicts.get(name)) for name, side in mine.items()]
    for outcome in outcomes:
        if outcome.kind != "agree":
            print(f"{outcome.kind:<13} {outcome.plan}: {outcome.detail}")
    counts = {kind: sum(o.kind == kind for o in outcomes) for kind in ("agree", "explained", "disagree", "not compared")}
    print(f"{len(outcomes)} plans: " + ", ".join(f"{count} {kind}" for kind, count in counts.items()))
    return 1 if counts["disagree"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
