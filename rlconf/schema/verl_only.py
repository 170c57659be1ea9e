"""Take the verl keys the typed schema does not hold out of a plan, before the schema sees it.

verl's trainer config has some 900 keys; the schema types the ones this engine runs. Every other
verl key is known (rlconf/schema/verl_compat.py): at verl's default it is accepted silently, since
that is what the run does anyway; at another value it is RL108 (error: the run would differ) or
RL109 (warning: not applied, the numbers are the same). A verl 0.9 spelling of a schema key moves
to the schema's key. Anything else stays in the plan for the schema, which reports it as unknown.
"""

from __future__ import annotations

from functools import cache
from typing import Any, NamedTuple, get_origin

from pydantic import BaseModel

from rlconf.diagnostics import Diagnostic, error, warning
from rlconf.sources import SourceMap
from rlconf.schema.plan import PlanConfig
from rlconf.schema.verl_compat import ALIASES, UNDECLARED, NotRun, verl_default, verl_facts, verl_only


class VerlSplit(NamedTuple):
    data: dict[str, Any]  # the plan the schema validates (verl-only keys out, aliases moved in)
    diagnostics: list[Diagnostic]


@cache
def schema_tree(model: type[BaseModel] = PlanConfig) -> dict[str, Any]:
    """Field name -> its section's tree, or None for a leaf (a dict-valued field is a leaf)."""
    from rlconf.schema.errors import section_type

    tree: dict[str, Any] = {}
    for name, info in model.model_fields.items():
        sub = section_type(info.annotation)
        is_section = isinstance(sub, type) and issubclass(sub, BaseModel) and get_origin(info.annotation) is not dict
        tree[name] = schema_tree(sub) if is_section else None
    return tree


@cache
def _verl_sections() -> frozenset[str]:
    """Every dotted prefix of a verl key: the sections of verl's config."""
    facts = verl_facts()
    keys = [*facts["keys"], *facts["removed"], *UNDECLARED]
    return frozenset(key.rsplit(".", n)[0] for key in keys for n in range(1, key.count(".") + 1))


def _known_leaf(key: str) -> tuple[str, Any] | None:
    """(verl key, default at `key`) for a verl key, or for a path inside a verl key whose default is a mapping."""
    probe = key
    while probe:
        known, default = verl_default(probe)
        if known:
            for part in key[len(probe) + 1:].split(".") if key != probe else ():
                default = default.get(part) if isinstance(default, dict) else None
            return probe, default
        probe = probe.rpartition(".")[0]
    return None


def _flatten(value: Any, prefix: str) -> list[tuple[str, Any]]:
    if isinstance(value, dict) and value and prefix in _verl_sections():
        out = []
        for key, item in value.items():
            out += _flatten(item, f"{prefix}.{key}")
        return out
    return [(prefix, value)]


def _shown(value: Any) -> str:
    import json  # here, like difflib below: a plan without verl-only keys never needs either

    text = json.dumps(value, default=str)
    return text if len(text) <= 60 else text[:57] + "..."


def _wrong_type(value: Any, default: Any) -> bool:
    """A clear type slip against verl's default (a string for a number, a number for a flag)."""
    if default is None or value is None:
        return False
    if isinstance(default, bool):
        return not isinstance(value, bool)
    if isinstance(default, (int, float)):
        return isinstance(value, bool) or not isinstance(value, (int, float))
    return False


def _same(value: Any, default: Any) -> bool:
    if isinstance(value, bool) != isinstance(default, bool):
        return False
    return value == default


def not_run_diagnostic(key: str, value: Any, default: Any, meaning: str, not_run: NotRun) -> Diagnostic:
    """RL108 (refused) or RL109 (accepted, not applied) for a verl setting off verl's default."""
    said = f"`{key}` is {_shown(value)}: verl has this" + (f" ({meaning})" if meaning else "")
    back = f"verl's default {_shown(default)}"
    if not_run.refused:
        return error("RL108", key, f"{said}; rlconf does not run {not_run.feature} yet: {not_run.why}",
                     help=f"use {not_run.instead}, or set it back to {back}" if not_run.instead else f"set it back to {back}")
    return warning("RL109", key, f"{said}; rlconf accepts it and does not apply it ({not_run.feature}): {not_run.why}",
                   help=f"use {not_run.instead}, or remove it" if not_run.instead else "remove it (the run is the same either way)")


def _judge(key: str, value: Any, split: VerlSplit) -> None:
    known = _known_leaf(key)
    listed = verl_only(key)
    if known is None or listed is None:
        section = key.rpartition(".")[0]
        siblings = [k.rpartition(".")[2] for k in (*verl_facts()["keys"], *verl_facts()["removed"]) if k.rpartition(".")[0] == section]
        import difflib

        close = difflib.get_close_matches(key.rpartition(".")[2], siblings, n=1, cutoff=0.6)
        split.diagnostics.append(error("RL101", key, f"unknown key `{key}`",
                                       help=f"did you mean `{section}.{close[0]}`?" if close else
                                       "remove it; docs/verl-compat.md lists every verl key"))
        return
    _, default = known
    meaning, not_run = listed
    if _wrong_type(value, default):
        split.diagnostics.append(error("RL102", key, f"`{key}` has the wrong type: verl's default is {_shown(default)}, "
                                                     f"found {_shown(value)}"))
    elif not _same(value, default):
        split.diagnostics.append(not_run_diagnostic(key, value, default, meaning, not_run))


def _get(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def _put(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, leaf = dotted.split(".")
    node = data
    for part in parents:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[leaf] = value


def split_verl_keys(raw: dict[str, Any], sources: SourceMap) -> VerlSplit:
    """The plan for the schema plus a diagnostic per verl-only setting off verl's default."""
    split = VerlSplit({}, [])
    moved: list[tuple[str, Any]] = []

    def walk(node: dict[str, Any], tree: dict[str, Any] | None, prefix: str, out: dict[str, Any]) -> None:
        for key, value in node.items():
            path = f"{prefix}{key}"
            sub = tree.get(key, ...) if tree is not None else ...
            if sub is not ...:
                if sub is not None and isinstance(value, dict):
                    out[key] = {}
                    walk(value, sub, path + ".", out[key])
                else:
                    out[key] = value
            elif path in ALIASES:
                moved.append((path, value))
            elif isinstance(value, dict) and any(alias.startswith(path + ".") for alias in ALIASES):
                walk(value, None, path + ".", {})  # a section holding aliases (critic.fsdp): its leaves, one by one
            elif _is_verl(path):
                for leaf, leaf_value in _flatten(value, path):
                    _point_at_written_value(sources, leaf)
                    _judge(leaf, leaf_value, split)
            elif tree is None:
                _judge(path, value, split)  # inside a verl section: unknown, with a did-you-mean from verl's keys
            else:
                out[key] = value  # unknown: the schema says so, with a did-you-mean

    walk(raw, schema_tree(), "", split.data)
    for alias, value in moved:
        target = ALIASES[alias]
        written = _get(split.data, target)
        if written is not None and value is not None:
            if written != value:  # verl writes both spellings at its default: equal values agree
                split.diagnostics.append(error("RL107", alias, f"`{alias}` (verl 0.9) is {_shown(value)} and `{target}` is "
                                                               f"{_shown(written)}: rlconf reads both as one setting",
                                               help=f"keep one of them (verl 0.9 reads `{alias}`)"))
            continue
        if value is not None:
            _put(split.data, target, value)
            for table in (sources.values, sources.keys):
                if alias in table:
                    table.setdefault(target, table[alias])
    return split


def _point_at_written_value(sources: SourceMap, key: str) -> None:
    """A mapping judged as one value (reward_kwargs) was written key by key: point at its first entry."""
    if key not in sources.values:
        inside = next((k for k in sources.values if k.startswith(key + ".")), None)
        if inside is not None:
            sources.values[key] = sources.values[inside]


def _is_verl(path: str) -> bool:
    return _known_leaf(path) is not None or path in _verl_sections()
