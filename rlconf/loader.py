"""Read a plan: YAML with source positions, `base:` inheritance, dotted overrides.

The result is a plain nested dict (what the schema validates) plus a SourceMap
that remembers where every value was written, so that diagnostics can point at
the exact line and column, or at the override that set the value.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, NamedTuple

from rlconf.diagnostics import PlanInputError, error
from rlconf.paths import probe, shorten
from rlconf.sources import Location, SourceMap

PRESETS_ENV = "RLCONF_PRESETS_DIR"
# A plan is a few KiB; reading stops past this, so a dataset passed by mistake is not read whole.
MAX_PLAN_BYTES = 1 << 20
BASE_KEY = "base"
YAML_KINDS = {"CommentedSeq": "list", "str": "string", "ScalarString": "string", "int": "number",
              "ScalarFloat": "number", "float": "number", "bool": "boolean", "ScalarBoolean": "boolean"}


def presets_dir() -> Path:
    """Bundled presets live in the repository's `presets/` folder (next to the package)."""
    override = os.environ.get(PRESETS_ENV)
    if override:
        return Path(override)
    return Path(__file__).resolve().parent.parent / "presets"


class RawPlan(NamedTuple):
    data: dict[str, Any]
    sources: SourceMap
    files: list[str]  # the plan file first, then its bases in resolution order


def load_plan(path: str | os.PathLike, overrides: list[str] | tuple[str, ...] = ()) -> RawPlan:
    """Load `path` with its `base:` chain merged underneath, then apply `key=value` overrides."""
    plan_path = Path(path)
    data, sources, files = _load_with_bases(plan_path, chain=())
    for text in overrides:
        apply_override(data, sources, text)
    return RawPlan(data, sources, files)


# --- YAML reading -------------------------------------------------------------------------


def _display_name(path: Path) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive on Windows
        return str(path)
    # Inside the working directory a short relative name reads best; outside it, the full path.
    return str(path) if relative.startswith("..") else relative


def _read_yaml(path: Path) -> tuple[dict[str, Any], SourceMap]:
    from rlconf.yamlparse import parse_plan_yaml

    name = _display_name(path)
    problem = probe(path)
    if problem is not None:
        raise PlanInputError(error("RL001", "", f"cannot read `{shorten(name)}`: {problem.reason}", help=problem.help))
    if not path.exists():
        raise PlanInputError(error("RL001", "", f"plan file `{shorten(name)}` does not exist",
                                   help="check the path; `rlconf presets` lists the bundled plans"))
    if path.is_dir():
        raise PlanInputError(error("RL001", "", f"`{shorten(name)}` is a directory, not a plan file"))
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_PLAN_BYTES + 1)  # never the whole of a dataset passed by mistake
    except OSError as exc:
        raise PlanInputError(error("RL001", "", f"cannot read `{shorten(name)}`: {exc.strerror}")) from exc
    if len(raw) > MAX_PLAN_BYTES:
        raise PlanInputError(error("RL008", "", f"`{shorten(name)}` is larger than {MAX_PLAN_BYTES // 2**20} MiB (the limit on a plan "
                                                "file): it looks like data, not a plan",
                                   help="a plan is a YAML file of a few KiB; pass data files as data.train_files"))
    text = _decode_utf8(raw, name)
    if "\x00" in text:
        raise PlanInputError(error("RL002", "", f"`{name}` contains NUL bytes: it looks like a binary file, not YAML"))
    lines = text.splitlines()
    sources = SourceMap(lines={name: lines})
    try:
        doc = parse_plan_yaml(text, name)
    except PlanInputError as exc:
        exc.sources = sources  # lets the CLI show the offending line
        raise
    if doc is None:
        raise PlanInputError(error("RL003", "", f"`{name}` is empty: a plan is a YAML mapping of sections",
                                   help="start from a preset: `rlconf presets show quickstart`").at(Location(name, 1, 1)))
    if not hasattr(doc, "items") or not hasattr(doc, "lc"):
        kind = YAML_KINDS.get(type(doc).__name__, type(doc).__name__)
        raise PlanInputError(error("RL003", "", f"`{name}` holds a YAML {kind}, not a mapping of sections",
                                   help="a plan looks like `data: {...}` / `actor_rollout_ref: {...}`").at(Location(name, 1, 1)))
    return _plain(doc, "", name, sources), sources


def _decode_utf8(raw: bytes, name: str) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        # The bad byte's line and column, counted the way the lines shown are split.
        before = raw[:exc.start].decode("utf-8", errors="replace").splitlines(keepends=True)
        last = before[-1] if before else ""
        if last and last.splitlines()[0] != last:  # the bad byte starts a line
            line, col = len(before) + 1, 1
        else:
            line, col = max(len(before), 1), len(last) + 1
        err = PlanInputError(error("RL002", "", f"`{shorten(name)}` is not UTF-8 text (byte {exc.start} is 0x{raw[exc.start]:02x})",
                                   help="a plan is a YAML text file; save it as UTF-8").at(Location(name, line, col)))
        err.sources = SourceMap(lines={name: raw.decode("utf-8", errors="replace").splitlines()})
        raise err from exc


def _plain(node: Any, prefix: str, file: str, sources: SourceMap) -> Any:
    """Convert ruamel's round-trip nodes to plain Python values, recording positions."""
    from ruamel.yaml.comments import CommentedMap, CommentedSeq

    if isinstance(node, CommentedMap):
        out: dict[str, Any] = {}
        for key, value in node.items():
            key_text = str(key)
            path = f"{prefix}.{key_text}" if prefix else key_text
            kline, kcol, vline, vcol = _key_position(node, key)
            sources.keys[path] = Location(file, kline + 1, kcol + 1, kcol + 1 + len(key_text))
            sources.values[path] = _value_location(file, sources, vline, vcol)
            out[key_text] = _plain(value, path, file, sources)
        return out
    if isinstance(node, CommentedSeq):
        items = []
        for i, item in enumerate(node):
            path = f"{prefix}[{i}]"
            line, col = node.lc.item(i) if node.lc.data else (node.lc.line, node.lc.col)
            sources.values[path] = _value_location(file, sources, line, col)
            items.append(_plain(item, path, file, sources))
        return items
    if isinstance(node, bool) or node is None:
        return node
    if isinstance(node, int):
        return int(node)
    if isinstance(node, float):
        return float(node)
    if isinstance(node, str):
        return str(node)
    return node


def _key_position(node: Any, key: Any) -> tuple[int, int, int, int]:
    """0-based (key line, key col, value line, value col) of `key` in the text. Keys pulled in by a
    YAML merge key (`<<: *x`) are positioned in the merged-from mapping; a mapping that records no
    positions (`!!omap`, one made only of merges) lends its own."""
    owner = _position_owner(node, key)
    if owner is None:
        line, col = node.lc.line or 0, node.lc.col or 0
        return line, col, line, col
    kline, kcol = owner.lc.key(key)
    vline, vcol = owner.lc.value(key)
    return kline, kcol, vline, vcol


def _position_owner(node: Any, key: Any) -> Any:
    if node.lc.data and key in node.lc.data:
        return node
    for source in getattr(node, "merge", []):
        if key in source:
            owner = _position_owner(source, key)
            if owner is not None:
                return owner
    return None


def _value_location(file: str, sources: SourceMap, line: int, col: int) -> Location:
    lines = sources.lines[file]
    line_text = lines[line] if line < len(lines) else ""
    return Location(file, line + 1, col + 1, _token_end(line_text, col) + 1)


def _token_end(line: str, col: int) -> int:
    """End column of the scalar starting at `col`: up to a comment, or in a flow collection
    (`{n: 0, ...}`, `[a, b]`) up to the next separator."""
    rest = line[col:]
    cut = rest.find(" #")
    if cut >= 0:
        rest = rest[:cut]
    if rest[:1] not in ("[", "{", "'", '"'):
        for stop in (",", "}", "]"):
            at = rest.find(stop)
            if at > 0:
                rest = rest[:at]
    return col + max(len(rest.rstrip()), 1)


# --- base inheritance -----------------------------------------------------------------------


def _resolve_base(name: str, including: Path, key_loc: Location | None) -> Path:
    candidates: list[Path] = []
    if name.endswith((".yaml", ".yml")) or "/" in name or os.sep in name:
        candidates.append(including.parent / name)
    else:
        candidates.append(presets_dir() / f"{name}.yaml")
        candidates.append(including.parent / f"{name}.yaml")
    for candidate in candidates:
        problem = probe(candidate)
        if problem is not None:
            raise PlanInputError(error("RL009", BASE_KEY, f"base `{shorten(name)}` cannot be used: {problem.reason}",
                                       help=problem.help).at(key_loc), exit_code=1)
        if candidate.is_file():
            return candidate.resolve()
    known = sorted(p.stem for p in presets_dir().glob("*.yaml"))
    raise PlanInputError(
        error("RL004", BASE_KEY, f"base `{shorten(name)}` is neither a bundled preset nor a file next to the plan",
              help=f"bundled presets: {', '.join(known) or '(none)'}; a relative path needs a .yaml suffix").at(key_loc),
        exit_code=1,
    )


def _load_with_bases(path: Path, chain: tuple[Path, ...]) -> tuple[dict[str, Any], SourceMap, list[str]]:
    data, sources = _read_yaml(path)  # first: it turns an unreadable path into RL001
    if BASE_KEY not in data:
        return data, sources, [_display_name(path)]
    try:
        return _merge_bases(path, chain, data, sources)
    except PlanInputError as exc:
        if exc.sources is None:  # a broken `base:` line of this file: show it
            exc.sources = sources
        raise


def _merge_bases(path: Path, chain: tuple[Path, ...], data: dict[str, Any],
                 sources: SourceMap) -> tuple[dict[str, Any], SourceMap, list[str]]:
    resolved = path.resolve() if path.exists() else path
    files = [_display_name(path)]
    base_value = data.pop(BASE_KEY)
    base_loc = sources.values.get(BASE_KEY)
    names = base_value if isinstance(base_value, list) else [base_value]
    if not names or not all(isinstance(n, str) and n for n in names):
        raise PlanInputError(error("RL004", BASE_KEY, "`base` must be a preset name, a relative .yaml path, or a list of them",
                                   help="e.g. `base: quickstart` or `base: ../common.yaml`").at(base_loc), exit_code=1)
    merged: dict[str, Any] = {}
    merged_sources = SourceMap()
    for name in names:
        base_path = _resolve_base(name, path, base_loc)
        if base_path in chain + (resolved,):
            cycle = " -> ".join(_display_name(p) for p in chain + (resolved, base_path))
            raise PlanInputError(error("RL005", BASE_KEY, f"`base:` chain loops back on itself: {cycle}",
                                       help="remove one of the `base:` references in this cycle").at(base_loc), exit_code=1)
        base_data, base_sources, base_files = _load_with_bases(base_path, chain + (resolved,))
        deep_merge(merged, base_data)
        merged_sources.merge_from(base_sources)
        files.extend(base_files)
    deep_merge(merged, data)
    merged_sources.merge_from(sources)  # the including file's positions win
    return merged, merged_sources, files


def deep_merge(target: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    """Merge `overlay` into `target` in place: mappings merge key by key, anything else replaces."""
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(target.get(key), dict):
            deep_merge(target[key], value)
        else:
            target[key] = value
    return target


# --- overrides -------------------------------------------------------------------------------


def parse_override(text: str) -> tuple[list[str], Any]:
    """`a.b.c=value` -> (["a", "b", "c"], value parsed as a YAML scalar/flow value)."""
    from ruamel.yaml.error import YAMLError

    from rlconf.yamlparse import PlanTextError, parse_value_yaml

    loc = Location(override=text)
    key, sep, raw_value = text.partition("=")
    key = key.strip().lstrip("+")  # accept Hydra's `+key=value` / `++key=value` spellings
    parts = key.split(".")
    if not sep or not key or not all(p.isidentifier() for p in parts):
        raise PlanInputError(error("RL006", key, f"override `{text}` is not of the form dotted.key=value",
                                   help="e.g. `actor_rollout_ref.rollout.n=8` or `trainer.logger=[console]`").at(loc),
                             exit_code=1)
    try:
        value = parse_value_yaml(raw_value) if raw_value.strip() else None
    except PlanTextError as exc:
        raise PlanInputError(error("RL006", key, f"override value of `{key}`: {exc.message}", help=exc.help).at(loc),
                             exit_code=1) from exc
    except YAMLError as exc:
        problem = getattr(exc, "problem", None) or "invalid YAML"
        raise PlanInputError(error("RL006", key, f"override value `{raw_value}` is not valid YAML: {problem}",
                                   help="quote strings that contain YAML punctuation, e.g. `key='a: b'`").at(loc),
                             exit_code=1) from exc
    return parts, value


def apply_override(data: dict[str, Any], sources: SourceMap, text: str) -> None:
    parts, value = parse_override(text)
    if parts == [BASE_KEY]:
        raise PlanInputError(error("RL006", BASE_KEY, f"override `{text}`: `base` can only be set in a plan file",
                                   help=f"write `base: {value}` at the top of a plan file, or pass that preset's path as the plan").at(
            Location(override=text)), exit_code=1)
    node = data
    for i, part in enumerate(parts[:-1]):
        child = node.setdefault(part, {})
        if not isinstance(child, dict):
            where = ".".join(parts[: i + 1])
            raise PlanInputError(error("RL006", where, f"override `{text}` goes inside `{where}`, which is a value, not a section").at(
                Location(override=text)), exit_code=1)
        node = child
    node[parts[-1]] = value
    dotted = ".".join(parts)
    # Positions under the overridden key no longer describe the value.
    for table in (sources.values, sources.keys):
        for stale in [k for k in table if k == dotted or k.startswith(dotted + ".") or k.startswith(dotted + "[")]:
            del table[stale]
    sources.values[dotted] = Location(override=text)
    sources.keys[dotted] = Location(override=text)
