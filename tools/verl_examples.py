"""How many of verl's example launch scripts `rlconf validate` accepts, pasted as overrides.

    git clone https://github.com/volcengine/verl /tmp/verl-src    # or any checkout
    python tools/verl_examples.py /tmp/verl-src [--list]

Takes every examples/**/*.sh that runs `verl.trainer.main_ppo` with the default FSDP config (no
--config-name / --config-path, no Megatron), substitutes the script's own variables as bash would
(plain assignments, ${VAR:-default}, $((arithmetic)), positional defaults), and validates an empty
plan with the script's overrides. Prints accepted / refused only with RL108 (a named feature rlconf
does not run) / other errors, and with --list each script's error codes.
"""

from __future__ import annotations

import argparse
import ast
import operator
import re
import shlex
import sys
import tempfile
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_]\w*)=(.*)$")
VARIABLE = re.compile(r"\$\{([A-Za-z_]\w*|\d+)(?::?-([^}]*))?\}|\$([A-Za-z_]\w*)")
ARITHMETIC = re.compile(r"\$\(\((.*?)\)\)")
OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.floordiv,
             ast.FloorDiv: operator.floordiv}


def _arithmetic(expression: str, env: dict[str, str]) -> str:
    expression = re.sub(r"\$?([A-Za-z_]\w*)", lambda m: env.get(m.group(1), "0"), expression)

    def value(node: ast.AST) -> int:
        if isinstance(node, ast.Expression):
            return value(node.body)
        if isinstance(node, ast.Constant):
            return int(node.value)
        if isinstance(node, ast.BinOp) and type(node.op) in OPERATORS:
            return OPERATORS[type(node.op)](value(node.left), value(node.right))
        raise ValueError(expression)

    return str(value(ast.parse(expression.strip(), mode="eval")))


def expand(text: str, env: dict[str, str]) -> str:
    text = ARITHMETIC.sub(lambda m: _arithmetic(m.group(1), env), text)
    return VARIABLE.sub(lambda m: env.get(m.group(1) or m.group(3), m.group(2) if m.group(2) is not None else ""), text)


def script_overrides(script: str) -> tuple[list[str], list[str]] | None:
    """(key=value overrides, --flags) of the script's main_ppo command; None if it has none."""
    env = {"HOME": "~"}
    for line in script.replace("\\\n", " ").splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        assignment = ASSIGN.match(stripped)
        if assignment and "main_ppo" not in stripped:
            try:
                words = shlex.split(expand(assignment.group(2), env), comments=True)
                env[assignment.group(1)] = words[0] if words else ""
            except (ValueError, KeyError, SyntaxError, ZeroDivisionError):
                pass
            continue
        if "verl.trainer.main_ppo" in stripped:
            words = shlex.split(expand(stripped, env), comments=True)
            words = words[next(i for i, w in enumerate(words) if "main_ppo" in w) + 1:]
            return ([w for w in words if re.match(r"^\+*[A-Za-z_][\w.]*=", w)], [w for w in words if w.startswith("--")])
    return None


def default_fsdp_scripts(verl: Path) -> dict[str, list[str]]:
    found = {}
    for path in sorted((verl / "examples").rglob("*.sh")):
        text = path.read_text(errors="replace")
        if "verl.trainer.main_ppo" not in text or "megatron" in text.lower():
            continue
        parsed = script_overrides(text)
        if parsed is None or any("config-name" in f or "config-path" in f for f in parsed[1]):
            continue
        found[str(path.relative_to(verl))] = parsed[0]
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("verl", type=Path, help="a checkout of volcengine/verl")
    parser.add_argument("--list", action="store_true", help="print each script's error codes")
    args = parser.parse_args()
    from rlconf.compile import compile_plan

    outcome: Counter[str] = Counter()
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.yaml"
        plan.write_text("{}\n")
        for name, overrides in default_fsdp_scripts(args.verl).items():
            errors = compile_plan(plan, overrides, resolve=False).errors
            kind = "accepted" if not errors else "refused only with RL108" if all(d.code == "RL108" for d in errors) else "other errors"
            outcome[kind] += 1
            if args.list:
                print(f"{kind:<24} {name} {' '.join(sorted({f'{d.code}:{d.key}' for d in errors}))}")
    total = sum(outcome.values())
    for kind in ("accepted", "refused only with RL108", "other errors"):
        print(f"{kind:<24} {outcome[kind]:>3} / {total}")


if __name__ == "__main__":
    main()
