"""Turn pydantic validation errors into diagnostics with stable codes and did-you-mean help."""

from __future__ import annotations

from typing import Any, get_args, get_origin

from pydantic import BaseModel, ValidationError

from rlconf.diagnostics import Diagnostic, error
from rlconf.schema.plan import PlanConfig

def _model_at(parts: list[str]) -> type[BaseModel] | None:
    """The section model at a dotted path of the schema, if the path names a section."""
    model: Any = PlanConfig
    for part in parts:
        if not (isinstance(model, type) and issubclass(model, BaseModel)) or part not in model.model_fields:
            return None
        model = section_type(model.model_fields[part].annotation)
    return model if isinstance(model, type) and issubclass(model, BaseModel) else None


def section_type(annotation: Any) -> Any:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in get_args(annotation):  # Optional[Section]
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return annotation


def all_schema_keys(model: type[BaseModel] = PlanConfig, prefix: str = "") -> list[str]:
    """Every dotted key the schema knows (sections and leaves)."""
    keys = []
    for name, field in model.model_fields.items():
        path = f"{prefix}.{name}" if prefix else name
        keys.append(path)
        sub = section_type(field.annotation)
        if isinstance(sub, type) and issubclass(sub, BaseModel) and get_origin(field.annotation) is not dict:
            keys.extend(all_schema_keys(sub, path))
    return keys


def suggest_key(dotted: str) -> str | None:
    """A did-you-mean for an unknown key: a close spelling in the same section, or the same
    name in another section (a key placed one level off is the commonest slip)."""
    parent, _, leaf = dotted.rpartition(".")
    section = _model_at(parent.split(".") if parent else [])
    everywhere = [k for k in all_schema_keys() if k.rpartition(".")[2] == leaf] or _verl_keys_named(leaf)
    if everywhere:
        return min(everywhere, key=lambda k: (abs(k.count(".") - dotted.count(".")), len(k)))
    if section is not None:
        import difflib  # here: verl_only imports this module for section_type on every plan, valid ones too

        close = difflib.get_close_matches(leaf, list(section.model_fields), n=1, cutoff=0.6)
        if close:
            return f"{parent}.{close[0]}" if parent else close[0]
    return None


def _verl_keys_named(leaf: str) -> list[str]:
    """verl keys with this last segment (a verl key the schema does not hold, placed one level off)."""
    from rlconf.schema.verl_compat import verl_facts

    return [k for k in verl_facts()["keys"] if k.rpartition(".")[2] == leaf]


def _dotted(loc: tuple, data: Any, missing: bool) -> str:
    """Keep only the loc parts that address the user's data (pydantic adds union-branch tags)."""
    parts: list[str] = []
    node = data
    for part in loc:
        if isinstance(part, int) and isinstance(node, list) and part < len(node):
            parts.append(f"[{part}]")
            node = node[part]
        elif isinstance(part, str) and isinstance(node, dict) and part in node:
            parts.append(("." if parts else "") + part)
            node = node[part]
        elif isinstance(part, str) and missing and isinstance(node, dict):
            parts.append(("." if parts else "") + part)
            break
        elif part == "[key]":
            continue
    return "".join(parts)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _type_help(dotted: str) -> str | None:
    field_parent, _, leaf = dotted.rpartition(".")
    section = _model_at(field_parent.split(".") if field_parent else [])
    if section is None or leaf not in section.model_fields:
        return None
    field = section.model_fields[leaf]
    default = field.get_default(call_default_factory=True)
    if isinstance(default, BaseModel):
        return f"`{dotted}` is a section: write its keys underneath it"
    return f"the default is `{default!r}`" if default is not None else None


def schema_diagnostics(exc: ValidationError, data: dict[str, Any]) -> list[Diagnostic]:
    seen: dict[str, Diagnostic] = {}
    for err in exc.errors(include_url=False):
        kind = err["type"]
        dotted = _dotted(err["loc"], data, missing=kind == "missing")
        value = err.get("input")
        ctx = err.get("ctx") or {}
        if kind == "extra_forbidden":
            guess = suggest_key(dotted)
            diag = error("RL101", dotted, f"unknown key `{dotted}`",
                         help=f"did you mean `{guess}`?" if guess else "remove it; `docs/config-reference.md` lists every key")
        elif kind == "missing":
            diag = error("RL105", dotted, f"`{dotted}` is required", help="add it (see docs/config-reference.md)")
        elif kind == "literal_error":
            diag = error("RL104", dotted, f"`{dotted}` is {_shown(value)}, which is not one of {ctx.get('expected', 'the allowed values')}",
                         help=_closest_choice(value, ctx.get("expected", "")))
        elif kind in {"greater_than", "greater_than_equal", "less_than", "less_than_equal"}:
            bound = {"greater_than": "> ", "greater_than_equal": ">= ", "less_than": "< ", "less_than_equal": "<= "}[kind]
            limit = next(iter(ctx.values()), "?")
            diag = error("RL103", dotted, f"`{dotted}` is {_shown(value)}, but it must be {bound}{limit}",
                         help=_type_help(dotted))
        elif kind == "finite_number":
            diag = error("RL103", dotted, f"`{dotted}` is {_shown(value)}, but it must be a finite number")
        else:
            diag = error("RL102", dotted, f"`{dotted}` has the wrong type: {err['msg'].lower()}, found {_shown(value)}",
                         help=_type_help(dotted))
        if dotted in seen:  # one diagnostic per key (unions report each branch)
            continue
        seen[dotted] = diag
    return list(seen.values())


def _closest_choice(value: Any, expected: str) -> str | None:
    choices = [c.strip().strip("'\"") for c in expected.replace(" or ", ", ").split(",") if c.strip()]
    import difflib

    close = difflib.get_close_matches(str(value), choices, n=1, cutoff=0.5)
    return f"did you mean `{close[0]}`?" if close else None
