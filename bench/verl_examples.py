"""verl's own example scripts pasted into `rlconf validate`: accepted, refused (and why), or misread.

    python bench/verl_examples.py --verl-repo /path/to/verl [--commit b178a3cd...] [--out results.json]

`--verl-repo` is a bare git dir (a mirror), a checkout, or a plain directory of verl's files (e.g.
`git archive` output; then `--commit` is not read). The JSON goes to --out, else to $OUT/verl_examples.json
when $OUT is set. CPU only, a few seconds: no GPU, no network, no import of torch.

Which scripts: every examples/**/*.sh at the commit that runs `python3 -m verl.trainer.main_ppo` on
verl's default config (no --config-name, or ppo_trainer; no --config-path, or verl's own `config`) and
no Megatron strategy. That is decided from the command bash hands to python, not from the script's text.

How the overrides are read: bash runs each script in an empty directory, with PATH holding only a
`python3`/`python` that writes down its arguments. Every other command is a no-op that prints nothing
(bash's command_not_found_handle; a launcher's python, `srun ... python -m ...`, still reaches the stub),
and so are `ulimit` and `source` of a file that is not there. So variables, defaults, arithmetic, arrays,
`if` branches and a script's own mistakes come out as bash computes them; what a command would print is
empty (`$(date +%Y%m%d)` in a run's name). Only a command named by an absolute path would run for real:
verl's examples at b178a3cd name none. The environment holds HOME=~ (so `$HOME` is written `~`, as in
tests/compiler/test_verl_examples.py) and what sbatch sets from the script's own `#SBATCH --nodes=1`
lines (SLURM_JOB_NUM_NODES, ...); the scratch directory is written `$PWD` in the overrides. Every
`key=value` argument is an override, as a verl user pastes it.

Each script's overrides are compiled on an empty plan (`rlconf.compile.compile_plan`, what `rlconf
explain` runs) and put through verl's arithmetic (tests/compiler/verl_reference.py `verl_normalize`,
the oracle the tests use):
- accepted: no error, and rlconf resolves the rollout replicas and every per-GPU number verl's workers
  compute (tests/compiler/verl_compare.py `number_differences`, the served reward model's replicas too);
- misread: no error, but a number differs, or verl would raise or silently floor a division;
- refused: errors, each listed with the feature an RL108 names. The kind says why: `named feature`
  (RL108 only), `verl refuses too` (the oracle raises or floors), `empty value` (the script's command
  line sets a key to nothing, from a variable it never sets), else `rlconf only`;
- unread: bash did not hand exactly one main_ppo command over.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "compiler"))  # the oracle and the comparison the tests use

from verl_compare import nest, number_differences  # noqa: E402
from verl_reference import verl_normalize, verl_served_reward_model_replicas  # noqa: E402

# The verl commit rlconf's verl facts and tests name (tests/compiler/test_verl_examples.py).
PINNED_COMMIT = "b178a3cd56f58b2d502255daba591e92833930a7"
ENTRY = "verl.trainer.main_ppo"
ENVIRONMENT = {"HOME": "~"}
# What sbatch exports from a script's own `#SBATCH` options (Slurm's output environment variables).
SBATCH_VARIABLES = {"nodes": ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"), "gpus-per-node": ("SLURM_GPUS_PER_NODE",),
                    "cpus-per-task": ("SLURM_CPUS_PER_TASK",), "ntasks-per-node": ("SLURM_NTASKS_PER_NODE",)}
SCRIPT_TIMEOUT_S = 10
OVERRIDE = re.compile(r"^[+~]*[A-Za-z_][\w.]*=")
FEATURE = re.compile(r"rlconf does not run (.+?) yet")

# A python that runs nothing: it writes its arguments, NUL-separated, one file per call.
PYTHON_STUB = """#!/bin/sh
if [ "$1" = "-m" ]; then printf '%s\\0' "$@" > "$RLCONF_CALLS/$$"; fi
exit 0
"""
# Sourced by the non-interactive bash before the script (BASH_ENV). A command that is not found does
# nothing, except that a launcher's python command (`srun ... python -m ...`) runs the stub; it reads its
# input to the end, so that a pipe into it (`| tee log`) never breaks the command before it.
BASH_PRELUDE = """command_not_found_handle() {
    local i
    for ((i = 2; i <= $#; i++)); do
        case "${!i}" in python | python3 | */python | */python3) "$RLCONF_BIN/${!i##*/}" "${@:i+1}"; break ;; esac
    done
    while IFS= read -r _; do :; done
    return 0
}
source() { if [ -f "$1" ]; then builtin source "$@"; fi; return 0; }
ulimit() { return 0; }
"""


# --- verl's files -----------------------------------------------------------------------------------


class VerlTree:
    """verl's files at a commit of a git dir (bare or a checkout), or as they lie in a plain directory."""

    def __init__(self, path: Path, commit: str):
        self.path = path
        bare = (path / "HEAD").is_file() and (path / "objects").is_dir()
        self.git = ["git", "--git-dir", str(path)] if bare else ["git", "-C", str(path)] if (path / ".git").exists() else None
        self.commit = self._git("rev-parse", "--verify", f"{commit}^{{commit}}").strip() if self.git else None

    def _git(self, *args: str, nothing_found: int | None = None) -> str:
        done = subprocess.run([*self.git, *args], capture_output=True, text=True)
        if done.returncode == nothing_found and not done.stdout:
            return ""
        if done.returncode:
            raise SystemExit(f"git {' '.join(args)} in {self.path} failed: {done.stderr.strip()}")
        return done.stdout

    def scripts_naming(self, text: str) -> list[str]:
        """The examples/**/*.sh whose text holds `text`, sorted."""
        if self.git:
            out = self._git("grep", "-l", "--fixed-strings", text, self.commit, "--", "examples/*.sh", nothing_found=1)
            return sorted(line.split(":", 1)[1] for line in out.splitlines())
        return sorted(str(p.relative_to(self.path)) for p in (self.path / "examples").rglob("*.sh")
                      if text in p.read_text(errors="replace"))

    def read(self, relative: str) -> str:
        if self.git:
            return self._git("show", f"{self.commit}:{relative}")
        return (self.path / relative).read_text(errors="replace")


# --- what bash hands to python ------------------------------------------------------------------------


@dataclass
class Run:
    calls: list[list[str]]  # each `python -m MODULE ARGS...` the script made, as argv after `python`
    returncode: int | None  # None: timed out
    stderr_tail: str


class Sandbox:
    """A scratch root with the python stub and bash prelude; each script runs in a fresh directory of it."""

    def __init__(self, root: Path, environment: dict[str, str]):
        self.bash = shutil.which("bash")
        if self.bash is None:
            raise SystemExit("bash is needed: the overrides are what bash hands to python")
        self.root, self.environment = root, environment
        self.bin = root / "bin"
        self.bin.mkdir()
        for name in ("python3", "python"):
            (self.bin / name).write_text(PYTHON_STUB)
            (self.bin / name).chmod(0o755)
        self.prelude = root / "prelude.bash"
        self.prelude.write_text(BASH_PRELUDE)
        self.runs = 0

    def run(self, name: str, text: str, environment: dict[str, str]) -> Run:
        self.runs += 1
        work, calls = self.root / f"work{self.runs}", self.root / f"calls{self.runs}"
        work.mkdir()
        calls.mkdir()
        script = work / Path(name).name
        script.write_text(text)
        env = {**environment, **self.environment, "PATH": str(self.bin), "BASH_ENV": str(self.prelude), "RLCONF_CALLS": str(calls),
               "RLCONF_BIN": str(self.bin)}
        try:
            done = subprocess.run([self.bash, script.name], cwd=work, env=env, capture_output=True,
                                  stdin=subprocess.DEVNULL, timeout=SCRIPT_TIMEOUT_S)
            code, stderr = done.returncode, done.stderr
        except subprocess.TimeoutExpired as exc:
            code, stderr = None, exc.stderr or b""
        recorded = sorted(calls.iterdir(), key=lambda p: (p.stat().st_mtime_ns, p.name))
        argvs = [p.read_bytes().decode(errors="replace").split("\0")[:-1] for p in recorded]
        # The scratch directory stands for wherever a user runs the script, as ~ stands for HOME.
        argvs = [[word.replace(str(work), "$PWD") for word in argv] for argv in argvs]
        return Run(argvs, code, stderr.decode(errors="replace")[-400:])


def config_choice(args: list[str]) -> tuple[str | None, str | None]:
    """(--config-path, --config-name) of a Hydra command line, either spelling (`--x=v` or `--x v`)."""
    found: dict[str, str | None] = {"--config-path": None, "--config-name": None}
    for i, word in enumerate(args):
        for flag in found:
            if word.startswith(flag + "="):
                found[flag] = word.split("=", 1)[1]
            elif word == flag and i + 1 < len(args):
                found[flag] = args[i + 1]
    return found["--config-path"], found["--config-name"]


def sbatch_environment(text: str) -> dict[str, str]:
    """The variables sbatch would set from the script's `#SBATCH --option=value` lines."""
    environment = {}
    for option, value in re.findall(r"^#SBATCH\s+--([\w-]+)=(\S+)", text, re.MULTILINE):
        for name in SBATCH_VARIABLES.get(option, ()):
            environment[name] = value
    return environment


def config_words_in_text(text: str) -> list[str]:
    """The config flags and strategies a script's text writes literally, for a script bash stops in
    before its main_ppo command (a value read from a variable is left out: the text cannot tell it)."""
    words = [f"--config-{flag}={value}" for flag, value in
             re.findall(r"--config-(name|path)[= ]\s*['\"]?([\w./-]+)['\"]?(?=[\s\\]|$)", text, re.MULTILINE)]
    words += [f"{key}={value}" for key, value in re.findall(r"([\w.]+\.strategy)=['\"]?(megatron)\b", text)]
    return words


def not_default_fsdp(args: list[str]) -> str | None:
    """Why a main_ppo command line is not verl's default FSDP config; None when it is."""
    config_path, config_name = config_choice(args)
    if config_name is not None and config_name.removesuffix(".yaml") != "ppo_trainer":
        return f"config {config_name}"
    # Hydra reads a relative --config-path from main_ppo's folder: `config` and `./config` are verl/trainer/config.
    if config_path is not None and config_path.removeprefix("./").rstrip("/") != "config":
        return f"config path {config_path}"
    for word in args:
        key, _, value = word.partition("=")
        if key.endswith(".strategy") and "megatron" in value.lower():
            return f"{key.lstrip('+')}={value}"
    return None


# --- the classification --------------------------------------------------------------------------------


@dataclass
class Refusal:
    code: str
    key: str
    message: str
    feature: str | None  # what an RL108 names as not run yet


@dataclass
class Outcome:
    path: str
    outcome: str  # accepted | refused | misread | unread
    overrides: list[str] = field(default_factory=list)
    other_arguments: list[str] = field(default_factory=list)  # command-line words that are no override
    kind: str | None = None  # for a refusal: why (see the module's docstring)
    errors: list[Refusal] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)  # "CODE key"
    verl: str = ""  # what verl's arithmetic does with the overrides: runs, raises ..., floors ...
    differences: list[str] = field(default_factory=list)  # for a misread: each number that differs
    verl_numbers: dict[str, Any] | None = None  # the numbers both sides agree on, for an accepted script
    sbatch: dict[str, str] = field(default_factory=dict)  # the variables the script's #SBATCH lines gave it

    @property
    def features(self) -> list[str]:
        return sorted({e.feature for e in self.errors if e.feature})

    def summary(self) -> str:
        if self.outcome == "accepted":
            return ""
        if self.outcome in ("misread", "unread"):
            return "; ".join(self.differences) or self.verl
        codes = sorted({f"{e.code} {e.key}" for e in self.errors if e.code != "RL108"})
        named = [f"RL108: {feature}" for feature in self.features]
        return f"[{self.kind}] " + "; ".join([*named, *codes])


def override_values(overrides: list[str]) -> dict[str, Any]:
    from rlconf.loader import parse_override

    values = {}
    for text in overrides:
        parts, value = parse_override(text)
        values[".".join(parts)] = value
    return values


def verl_verdict(values: dict[str, Any]):
    """(VerlResult or None, what verl does): the oracle's reading of the same overrides."""
    try:
        result = verl_normalize(nest(values))
    except Exception as exc:  # verl's own asserts and raises, and what a wrong type trips in its arithmetic
        return None, f"raises {type(exc).__name__}: {exc}"
    if result.floored:
        return result, "floors " + "; ".join(result.floored)
    return result, "runs"


def classify(path: str, args: list[str], plan: Path) -> Outcome:
    """One main_ppo command line (the arguments after the module), pasted as overrides on an empty plan."""
    from rlconf.compile import compile_plan
    from rlconf.diagnostics import PlanInputError

    overrides = [w for w in args if OVERRIDE.match(w)]
    config_words = {w for i, w in enumerate(args) if w.startswith("--config-")
                    or (i and args[i - 1] in ("--config-path", "--config-name"))}
    out = Outcome(path, "refused", overrides, [w for w in args if w not in overrides and w not in config_words])
    result = compile_plan(plan, overrides)
    out.warnings = [f"{d.code} {d.key}" for d in result.warnings]
    out.errors = [Refusal(d.code, d.key, d.message, (m.group(1) if d.code == "RL108" and (m := FEATURE.search(d.message)) else None))
                  for d in result.errors]
    try:
        values = override_values(overrides)
    except PlanInputError:  # an override rlconf cannot read: compile_plan said so, the oracle has nothing to read
        values = None
    verl, out.verl = verl_verdict(values) if values is not None else (None, "not read: an override is malformed")
    if out.errors:
        empty = {key for key, value in (values or {}).items() if value is None}
        reasons = set()
        for error in out.errors:
            if error.code == "RL108":
                continue
            reasons.add("empty value" if error.key in empty else "verl refuses too" if verl is None or verl.floored
                        else "rlconf only")
        out.kind = "named feature" if not reasons else ", ".join(sorted(reasons))
        return out
    if verl is None or verl.floored:
        out.outcome, out.differences = "misread", [f"rlconf accepts it, verl {out.verl}"]
        return out
    out.differences = number_differences(result.resolved.roles, verl)
    served = result.resolved.roles.served_reward_model
    mine = served.replicas if served else None
    try:
        verls = verl_served_reward_model_replicas(nest(values))
    except Exception as exc:
        verls = f"raises {type(exc).__name__}: {exc}"
    if mine != verls:
        out.differences.append(f"served_reward_model.replicas: rlconf {mine}, verl {verls}")
    out.outcome = "misread" if out.differences else "accepted"
    if not out.differences:
        out.verl_numbers = {"actor": verl.actor, "rollout": verl.rollout, "ref": verl.ref, "critic": verl.critic,
                            "served_reward_model_replicas": verls}
    return out


def measure(tree: VerlTree, environment: dict[str, str]) -> tuple[list[Outcome], list[dict[str, str]]]:
    """(the outcome of each selected script, the main_ppo scripts left out and why)."""
    outcomes, skipped = [], []
    with tempfile.TemporaryDirectory(prefix="verl-examples-") as tmp:
        sandbox = Sandbox(Path(tmp), environment)
        plan = Path(tmp) / "plan.yaml"
        plan.write_text("{}\n")  # nothing but the script's overrides, as on verl's command line
        for path in tree.scripts_naming(ENTRY):
            text = tree.read(path)
            sbatch = sbatch_environment(text)
            run = sandbox.run(path, text, sbatch)
            entries = [argv[2:] for argv in run.calls if argv[:2] == ["-m", ENTRY]]
            reasons = {not_default_fsdp(args) for args in entries} - {None}
            if not entries and (reason := not_default_fsdp(config_words_in_text(text))):
                reasons = {f"{reason} (read from the script's text: bash stopped before main_ppo)"}
            others = sorted({argv[1] for argv in run.calls if len(argv) > 1} - {ENTRY})
            if not entries and others and run.returncode == 0:
                # it names main_ppo only in a comment or an echo, and runs another entry point
                skipped.append({"path": path, "reason": "runs " + ", ".join(others)})
            elif reasons:
                skipped.append({"path": path, "reason": "; ".join(sorted(reasons))})
            elif len(entries) != 1:
                status = "timed out" if run.returncode is None else f"exit {run.returncode}"
                said = [line for line in run.stderr_tail.splitlines() if line.strip() and not line.startswith("+")]
                outcomes.append(Outcome(path, "unread", verl=f"bash ran {len(entries)} main_ppo commands ({status})"
                                        + (f": {said[-1].strip()}" if said else ""), sbatch=sbatch))
            else:
                outcomes.append(classify(path, entries[0], plan))
                outcomes[-1].sbatch = sbatch
    return outcomes, skipped


# --- the report ---------------------------------------------------------------------------------------------


def rlconf_commit() -> str:
    def git(*args: str) -> str:
        return subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True).stdout.strip()

    head = git("rev-parse", "--short", "HEAD") or "unknown"
    return head + (" (uncommitted changes)" if git("status", "--porcelain", "--untracked-files=no") else "")


def totals(outcomes: list[Outcome]) -> dict[str, int]:
    counts = {kind: sum(1 for o in outcomes if o.outcome == kind) for kind in ("accepted", "refused", "misread", "unread")}
    return {"scripts": len(outcomes), **counts}


def table(outcomes: list[Outcome]) -> str:
    width = max((len(o.path.removeprefix("examples/")) for o in outcomes), default=10)
    lines = [f"{'outcome':<9} {'script (under examples/)':<{width}}  why"]
    lines += [f"{o.outcome:<9} {o.path.removeprefix('examples/'):<{width}}  {o.summary()}".rstrip() for o in outcomes]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--verl-repo", type=Path, required=True, help="verl's git dir (bare or a checkout) or its files")
    parser.add_argument("--commit", default=PINNED_COMMIT, help=f"the commit to read (default {PINNED_COMMIT[:8]}, the tests')")
    parser.add_argument("--out", type=Path, help="the JSON's path (default $OUT/verl_examples.json when $OUT is set)")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="one more variable of the scripts' environment (repeatable)")
    args = parser.parse_args(argv)
    environment = dict(ENVIRONMENT)
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep:
            parser.error(f"--env {item!r}: expected NAME=VALUE")
        environment[name] = value

    tree = VerlTree(args.verl_repo, args.commit)
    outcomes, skipped = measure(tree, environment)
    report = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "rlconf_commit": rlconf_commit(),
        "verl_repo": str(args.verl_repo),
        "verl_commit": tree.commit or "not read (a plain directory)",
        "environment": environment,
        "totals": totals(outcomes),
        "scripts": [{**asdict(o), "features": o.features, "summary": o.summary()} for o in outcomes],
        "left_out": skipped,
    }
    print(table(outcomes))
    print()
    print(f"verl {report['verl_commit'][:8]}, rlconf {report['rlconf_commit']}: " +
          ", ".join(f"{count} {kind}" for kind, count in report["totals"].items()) +
          f" ({len(skipped)} other main_ppo scripts left out: Megatron or another config)")
    out = args.out or (Path(os.environ["OUT"]) / "verl_examples.json" if os.environ.get("OUT") else None)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {out}")
    return report


if __name__ == "__main__":
    main()
