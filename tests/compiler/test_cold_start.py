"""What keeps a cold `rlconf validate` short (bench/validate_cold.py) must not change what it answers:
absent sections written as `{}` give the same plan, pydantic's plugin switch is put back, the
plan is validated by one validator instead of one per section, and the stand-in for pydantic's plugin
loader answers as pydantic's own loader does."""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from pydantic import BaseModel

from rlconf.compile import compile_plan, validate_schema, with_default_sections
from rlconf.loader import load_plan
from rlconf.schema import PlanConfig
from rlconf.schema.optim import OptimConfig

REPO = Path(__file__).resolve().parents[2]
PLANS = sorted((REPO / "presets").glob("*.yaml")) + [Path(__file__).parent / "bad_plans" / "bases" / "valid_baseline.yaml"]


@pytest.mark.parametrize("path", PLANS, ids=[p.stem for p in PLANS])
def test_absent_sections_written_as_empty_give_the_same_plan(path: Path) -> None:
    raw = load_plan(path).data
    before = copy.deepcopy(raw)
    filled = with_default_sections(PlanConfig, raw)
    assert raw == before, "the raw plan (used by rules and diagnostics) is left as written"
    assert PlanConfig.model_validate(filled).model_dump() == PlanConfig.model_validate(raw).model_dump()
    assert set(filled) >= {"data", "actor_rollout_ref", "critic", "trainer", "estimate"}


def test_only_sections_that_default_to_an_empty_section_are_written() -> None:
    filled = with_default_sections(PlanConfig, {})
    assert "placement" not in filled  # defaults to None: writing {} would change the plan
    # critic.optim defaults to OptimConfig(lr=1e-5), not to an empty section: left to its factory
    assert "optim" not in filled["critic"]
    assert filled["actor_rollout_ref"]["actor"]["optim"] == {}
    default = validate_schema({}).critic.optim
    assert default == OptimConfig(lr=1e-5) and default.model_fields_set == {"lr"}


@pytest.mark.parametrize("preset", [None, "", "my_plugin"])
def test_pydantic_plugin_switch_is_put_back(monkeypatch, preset) -> None:
    if preset is None:
        monkeypatch.delenv("PYDANTIC_DISABLE_PLUGINS", raising=False)
    else:
        monkeypatch.setenv("PYDANTIC_DISABLE_PLUGINS", preset)
    compile_plan(REPO / "presets" / "quickstart.yaml", resolve=False)
    assert os.environ.get("PYDANTIC_DISABLE_PLUGINS") == preset


def test_validate_builds_no_validator_per_section() -> None:
    """In a fresh interpreter (this one has built validators for other tests): after `validate`, no
    section class has a validator of its own, neither those whose default is an empty instance of
    themselves nor OptimConfig, whose critic default is made without validation."""
    probe = """
import json, sys
from pydantic import BaseModel
from rlconf.compile import compile_plan
from rlconf.schema import PlanConfig
from rlconf.schema.optim import OptimConfig
assert compile_plan(sys.argv[1], resolve=False).exit_code() == 0
def sections(model):  # (section class, whether its default is an empty one)
    for info in model.model_fields.values():
        section = info.annotation
        if isinstance(section, type) and issubclass(section, BaseModel):
            yield section, info.default_factory is section
            yield from sections(section)
print(json.dumps(sorted({s.__name__ for s, _ in sections(PlanConfig) if s.__pydantic_complete__})))
"""
    proc = subprocess.run([sys.executable, "-c", probe, "presets/grpo_7b_8gpu.yaml"], capture_output=True, text=True,
                          cwd=REPO, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == []


# In a fresh interpreter: pydantic's loader must not have been imported yet for the stand-in to matter.
PLUGIN_PROBE = """
import json, os, sys
from rlconf.plugin_loader import LOADER, defer_plugin_loader
defer_plugin_loader()
from pydantic import BaseModel
os.environ["PYDANTIC_DISABLE_PLUGINS"] = sys.argv[1]
class Before(BaseModel):  # built while the switch is as given
    n: int
assert Before(n=2).n == 2
after_first = {"metadata_imported": "importlib.metadata" in sys.modules,
               "pydantic_loader": hasattr(sys.modules[LOADER], "PYDANTIC_ENTRY_POINT_GROUP")}
del os.environ["PYDANTIC_DISABLE_PLUGINS"]
class After(BaseModel):  # built with plugins wanted
    n: int
assert After(n=3).n == 3
print(json.dumps({"after_first": after_first, "pydantic_loader_at_end": hasattr(sys.modules[LOADER], "PYDANTIC_ENTRY_POINT_GROUP")}))
"""


@pytest.mark.parametrize("switch, skipped", [("1", True), ("true", True), ("__all__", True), ("my_plugin", False), ("", False)])
def test_plugin_loader_stand_in_answers_as_pydantic_does(switch: str, skipped: bool) -> None:
    """With plugins switched off entirely, validators are built without importing pydantic's loader
    (nor importlib.metadata, the 17 ms saved); with any other value of the switch, or none, the
    stand-in hands over to pydantic's own loader, which then stays in place for later validators."""
    proc = subprocess.run([sys.executable, "-c", PLUGIN_PROBE, switch], capture_output=True, text=True, cwd=REPO,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["after_first"] == {"metadata_imported": not skipped, "pydantic_loader": not skipped}
    assert report["pydantic_loader_at_end"] is True


YAML_FILES = sorted((REPO / "presets").glob("*.yaml")) + sorted((Path(__file__).parent / "bad_plans").rglob("*.yaml"))
COMMENTED = """\
# a plan full of comments: before, between and after keys, in flow lists, after values
data:  # section
  train_batch_size: 16   # global
  # between keys
  max_prompt_length: 64
trainer: {nnodes: 1,  # inside a flow mapping
          n_gpus_per_node: 4}
logger: [console,   # inside a flow list
         tensorboard]
"""


def _load_with(scanner, path: Path) -> tuple:
    """What load_plan answers, positions included, with `scanner` doing the plan's scanning."""
    from rlconf import yamlparse
    from rlconf.diagnostics import PlanInputError

    previous, yamlparse.PLAN_SCANNER = yamlparse.PLAN_SCANNER, scanner
    try:
        raw = load_plan(path)
        return raw.data, raw.sources.keys, raw.sources.values, raw.files
    except PlanInputError as exc:
        return "error", exc.diagnostic, exc.exit_code
    finally:
        yamlparse.PLAN_SCANNER = previous


@pytest.mark.parametrize("path", YAML_FILES + ["commented"], ids=lambda p: p if isinstance(p, str) else p.stem)
def test_plain_scanner_reads_plans_as_the_round_trip_scanner_does(path, tmp_path: Path) -> None:
    """The plan is scanned without ruamel's comment-keeping RoundTripScanner: same values, same key
    and value positions, same errors, for every preset and bad plan and a plan full of comments."""
    from ruamel.yaml.scanner import RoundTripScanner, Scanner

    if path == "commented":
        path = tmp_path / "commented.yaml"
        path.write_text(COMMENTED)
    plain = _load_with(Scanner, path)
    assert plain == _load_with(RoundTripScanner, path)
    if path.name == "commented.yaml":
        assert plain[0]["trainer"] == {"nnodes": 1, "n_gpus_per_node": 4}
        assert plain[1]["trainer.n_gpus_per_node"].line == 7
