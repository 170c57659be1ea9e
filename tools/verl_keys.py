"""Regenerate rlconf/schema/verl_keys.json: every key of verl's trainer config with verl's default.

    pip download verl==0.9.1 --no-deps -d /tmp/verl
    pip install omegaconf            # resolves the `${...}` defaults the way verl does
    python tools/verl_keys.py /tmp/verl/verl-0.9.1-py3-none-any.whl \
        --older b178a3cd=<(git -C verl show b178a3cd:verl/trainer/config/_generated_ppo_trainer.yaml)

The source is verl's flattened config, `verl/trainer/config/_generated_ppo_trainer.yaml` (what
`python -m verl.trainer.main_ppo` composes with the default FSDP engine). Each leaf is recorded
with its default after OmegaConf resolves the interpolations (as verl does when it builds its
config objects), and, for an interpolated default, the keys it follows. Only facts are recorded
(names, defaults, which key a default follows); the meaning of each key is rlconf's own text, in
rlconf/schema/ and rlconf/schema/verl_compat.py.

`--older LABEL=FILE` adds the keys an older generated config has and this one does not (verl's own
example scripts still set some of them) under "removed", with their defaults there.
"""

from __future__ import annotations

import argparse
import json
import re
import zipfile
from pathlib import Path
from typing import Any

CONFIG = "verl/trainer/config/_generated_ppo_trainer.yaml"
VERSION = "verl/version/version"
OUT = Path(__file__).resolve().parent.parent / "rlconf" / "schema" / "verl_keys.json"
REFERENCE = re.compile(r"\$\{(?:oc\.select:)?\s*([A-Za-z_.][\w.]*)")


def read_source(path: Path) -> tuple[str, str]:
    """(config text, verl version) from a wheel or an unpacked/installed package root."""
    if path.suffix == ".whl":
        with zipfile.ZipFile(path) as wheel:
            return wheel.read(CONFIG).decode(), wheel.read(VERSION).decode().strip()
    root = path if (path / CONFIG).exists() else path.parent
    return (root / CONFIG).read_text(), (root / VERSION).read_text().strip()


def leaves(node: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted leaf keys in file order; an empty mapping is a leaf (its default is `{}`)."""
    if isinstance(node, dict) and node:
        out = []
        for key, value in node.items():
            out += leaves(value, f"{prefix}.{key}" if prefix else str(key))
        return out
    return [(prefix, node)]


def lookup(tree: dict[str, Any], key: str) -> Any:
    node: Any = tree
    for part in key.split("."):
        node = node[part]
    return node


def absolute(reference: str, key: str) -> str:
    """`.x` / `..x` in an interpolation are relative to the node that holds `key`."""
    if not reference.startswith("."):
        return reference
    depth = len(reference) - len(reference.lstrip("."))
    parent = key.split(".")[:-depth]
    return ".".join(parent + [reference.lstrip(".")])


def build(text: str, version: str, older: dict[str, str] | None = None) -> dict[str, Any]:
    keys = resolved_keys(text)
    removed: dict[str, Any] = {}
    for label, older_text in (older or {}).items():
        for key, entry in resolved_keys(older_text).items():
            if key not in keys and key not in removed:
                removed[key] = {"default": entry["default"], "seen_in": label}
    return {"verl_version": version, "source": CONFIG, "keys": keys, "removed": removed}


def resolved_keys(text: str) -> dict[str, Any]:
    import yaml
    from omegaconf import OmegaConf

    raw = yaml.safe_load(text)
    resolved = OmegaConf.to_container(OmegaConf.create(raw), resolve=True, throw_on_missing=False)
    keys: dict[str, Any] = {}
    for key, written in leaves(raw):
        # A leaf written as `${...}` may resolve to a whole section (rollout.mtp -> model.mtp).
        entry: dict[str, Any] = {"default": lookup(resolved, key)}
        if written == "???":
            entry = {"default": None, "required": True}
        elif isinstance(written, str) and "${" in written:
            entry["follows"] = list(dict.fromkeys(absolute(ref, key) for ref in REFERENCE.findall(written)))
        keys[key] = entry
    return keys


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("verl", type=Path, help="verl wheel, or the directory holding the `verl` package")
    parser.add_argument("--out", type=Path, default=OUT)
    parser.add_argument("--older", action="append", default=[], metavar="LABEL=FILE",
                        help="an older _generated_ppo_trainer.yaml whose removed keys are recorded too")
    args = parser.parse_args()
    text, version = read_source(args.verl)
    older = {label: Path(file).read_text() for label, _, file in (item.partition("=") for item in args.older)}
    facts = build(text, version, older)
    args.out.write_text(json.dumps(facts, indent=1) + "\n")
    print(f"wrote {args.out}: {len(facts['keys'])} keys of verl {version}")


if __name__ == "__main__":
    main()
