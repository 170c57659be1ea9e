"""The rules reference and the configuration reference are generated from the code; these tests
fail when a code is undocumented, an example stops triggering its code, or a doc is stale."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from rlconf.docgen import GENERATED, DOCS, _render_example
from rlconf.rules.catalog import BY_CODE, RULES

ROOT = Path(__file__).resolve().parents[2]


def codes_emitted_by_the_compiler() -> set[str]:
    found: set[str] = set()
    for path in (ROOT / "rlconf").rglob("*.py"):
        if path.name == "catalog.py":
            continue
        found |= set(re.findall(r'"(RL\d{3})"', path.read_text()))
    return found


def test_every_code_the_compiler_emits_is_in_the_catalog():
    missing = codes_emitted_by_the_compiler() - set(BY_CODE)
    assert not missing, f"undocumented diagnostic codes: {sorted(missing)}"


def test_every_catalog_code_is_emitted_somewhere():
    unused = set(BY_CODE) - codes_emitted_by_the_compiler()
    assert not unused, f"catalog lists codes nothing emits: {sorted(unused)}"


@pytest.mark.parametrize("rule", RULES, ids=[r.code for r in RULES])
def test_each_rule_example_triggers_its_own_code(rule):
    _, output, codes = _render_example(rule)
    assert rule.code in codes, f"{rule.code} example produced {codes}"
    assert f"[{rule.code}]" in output


@pytest.mark.parametrize("name", sorted(GENERATED))
def test_generated_doc_is_up_to_date(name):
    path = DOCS / name
    assert path.exists(), f"docs/{name} missing: run `python -m rlconf.docgen`"
    assert path.read_text() == GENERATED[name](), f"docs/{name} is stale: run `python -m rlconf.docgen`"


def test_config_reference_lists_every_schema_key():
    from rlconf.schema.errors import all_schema_keys

    text = (DOCS / "config-reference.md").read_text()
    missing = [k for k in all_schema_keys() if f"`{k}`" not in text]
    assert not missing, missing[:10]
