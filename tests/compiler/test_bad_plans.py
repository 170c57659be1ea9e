"""A corpus of malformed plans: each must fail cleanly with the right exit code, diagnostic code
and location, in text and JSON, and never with a traceback.

Every file in bad_plans/ (not bases/) starts with a header line:

    # expect: exit=<1|2> code=<RLxxx> key=<dotted.key or -> [line=<n>] [suggest=<dotted.key>]

and may have a second one, `# overrides: a.b=1 c.d=2`, with command-line overrides.
`line` is the line the diagnostic must point at; `suggest` the key a did-you-mean must name.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from typer.testing import CliRunner

from rlconf.cli import app

HERE = Path(__file__).parent
CORPUS = HERE / "bad_plans"
BASELINE = CORPUS / "bases" / "valid_baseline.yaml"
REPO = HERE.parent.parent


@dataclass(frozen=True)
class Expectation:
    exit: int
    code: str
    key: str  # "" for file-level diagnostics (written `-` in the header)
    line: int | None = None
    suggest: str | None = None
    overrides: list[str] = field(default_factory=list)


def parse_header(path: Path) -> Expectation:
    # Read bytes: some entries are deliberately not UTF-8 after the header.
    head = path.read_bytes().split(b"\n")[:2]
    first = head[0].decode("ascii")
    assert first.startswith("# expect:"), f"{path.name}: first line must be `# expect: ...`"
    fields = dict(part.split("=", 1) for part in first[len("# expect:"):].split())
    unknown = set(fields) - {"exit", "code", "key", "line", "suggest"}
    assert not unknown, f"{path.name}: unknown header fields {unknown}"
    overrides: list[str] = []
    if len(head) > 1 and head[1].startswith(b"# overrides:"):
        overrides = head[1].decode("utf-8")[len("# overrides:"):].split()
    return Expectation(
        exit=int(fields["exit"]),
        code=fields["code"],
        key="" if fields["key"] == "-" else fields["key"],
        line=int(fields["line"]) if "line" in fields else None,
        suggest=fields.get("suggest"),
        overrides=overrides,
    )


def corpus_files() -> list[Path]:
    return sorted(p for p in CORPUS.glob("*.yaml") if p.is_file())


CASES = corpus_files()
runner = CliRunner()


def invoke(*args: str):
    result = runner.invoke(app, list(args))
    # Typer turns a clean exit into SystemExit; anything else escaping is a crash.
    assert result.exception is None or isinstance(result.exception, SystemExit), (
        f"exception escaped: {result.exception!r}\n{result.output}")
    assert "Traceback" not in result.output, result.output
    return result


def matching(diagnostics: list[dict], exp: Expectation) -> list[dict]:
    return [d for d in diagnostics if d["code"] == exp.code and d["key"] == exp.key]


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_bad_plan_text_output(path: Path) -> None:
    exp = parse_header(path)
    result = invoke("validate", str(path), *exp.overrides)
    out = result.output
    assert result.exit_code == exp.exit, out
    assert f"error[{exp.code}]" in out, out
    if exp.line is not None:
        assert f":{exp.line}:" in out, f"expected a location on line {exp.line}:\n{out}"
    elif exp.key:
        assert exp.key in out, f"expected the key `{exp.key}` to be named:\n{out}"
    if exp.suggest:
        assert f"did you mean `{exp.suggest}`?" in out, out
    assert "✗" in out, "the summary line must report the failure"


@pytest.mark.parametrize("path", CASES, ids=[p.stem for p in CASES])
def test_bad_plan_json_output(path: Path) -> None:
    exp = parse_header(path)
    result = invoke("validate", str(path), *exp.overrides, "--format", "json")
    assert result.exit_code == exp.exit, result.output
    payload = json.loads(result.stdout)
    assert payload["valid"] is False
    assert payload["exit_code"] == exp.exit
    found = matching(payload["diagnostics"], exp)
    assert found, f"no {exp.code} for key `{exp.key}` in {json.dumps(payload['diagnostics'], indent=1)}"
    diag = found[0]
    assert diag["severity"] == "error"
    assert diag["message"]
    if exp.line is not None:
        assert diag["location"] and f":{exp.line}:" in diag["location"], diag
    if exp.overrides:
        # A value set on the command line is located at the override, not at the file.
        assert diag["location"] and diag["location"].startswith("override `"), diag
    if exp.suggest:
        assert diag["help"] == f"did you mean `{exp.suggest}`?", diag
    for other in payload["diagnostics"]:
        # A fix-it that suggests nothing (an empty list, a multiple of 0) is noise from a cascade.
        text = f"{other['message']} {other['help'] or ''}"
        assert "(e.g. )" not in text and "multiple of 0 " not in text and "over 0 " not in text, other


def test_corpus_is_large_enough() -> None:
    assert len(CASES) >= 40
    # Every entry declares its expectation (the parser asserts the header shape).
    codes = {parse_header(p).code for p in CASES}
    assert len(codes) >= 30, sorted(codes)


def test_corpus_baseline_is_valid() -> None:
    """Each entry breaks this plan in one place; it must itself be clean."""
    result = invoke("validate", str(BASELINE), "--format", "json")
    payload = json.loads(result.stdout)
    assert result.exit_code == 0, result.output
    assert payload["diagnostics"] == []


def test_nonexistent_plan_path_is_rl001_exit_2(tmp_path: Path) -> None:
    missing = tmp_path / "no_such_plan.yaml"
    result = invoke("validate", str(missing))
    assert result.exit_code == 2, result.output
    assert "error[RL001]" in result.output
    assert "no_such_plan.yaml" in result.output
    result = invoke("validate", str(missing), "--format", "json")
    payload = json.loads(result.stdout)
    assert result.exit_code == 2
    assert [d["code"] for d in payload["diagnostics"]] == ["RL001"]


def test_directory_as_plan_is_rl001_exit_2(tmp_path: Path) -> None:
    result = invoke("validate", str(tmp_path))
    assert result.exit_code == 2, result.output
    assert "error[RL001]" in result.output


def test_zero_byte_file_is_rl003_exit_2(tmp_path: Path) -> None:
    empty = tmp_path / "empty.yaml"
    empty.write_bytes(b"")
    result = invoke("validate", str(empty))
    assert result.exit_code == 2, result.output
    assert "error[RL003]" in result.output


def test_pure_binary_file_is_rl002_exit_2(tmp_path: Path) -> None:
    garbage = tmp_path / "image.yaml"
    garbage.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(range(256)))
    result = invoke("validate", str(garbage), "--format", "json")
    assert result.exit_code == 2, result.output
    payload = json.loads(result.stdout)
    assert [d["code"] for d in payload["diagnostics"]] == ["RL002"]
    assert "UTF-8" in payload["diagnostics"][0]["message"]


SUBPROCESS_SAMPLE = ["yaml_unclosed_bracket", "binary_png_bytes", "micro_not_dividing_mini",
                     "misspelled_max_prompt_length", "override_wrong_type", "yaml_alias_bomb", "yaml_python_object_tag",
                     "yaml_deep_nesting"]


def test_console_entry_point_has_no_traceback() -> None:
    """The real console path (rich rendering to a pipe, no CliRunner) on a sample of the corpus."""
    for stem in SUBPROCESS_SAMPLE:
        path = CORPUS / f"{stem}.yaml"
        exp = parse_header(path)
        proc = subprocess.run([sys.executable, "-m", "rlconf", "validate", str(path), *exp.overrides],
                              capture_output=True, text=True, cwd=REPO, timeout=60)
        both = proc.stdout + proc.stderr
        assert "Traceback" not in both, both
        assert proc.returncode == exp.exit, f"{stem}: {both}"
        assert f"error[{exp.code}]" in proc.stdout, f"{stem}: {both}"


# --- the loader's limits and refusals --------------------------------------------------------


def test_alias_bomb_is_refused_quickly_naming_the_limit() -> None:
    """Nine nested aliases expand to 387 million values; the loader must stop at its limit, fast,
    in a real process (no CliRunner), pointing at the alias that passed it."""
    path = CORPUS / "yaml_alias_bomb.yaml"
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rlconf", "validate", str(path), "--format", "json"],
                          capture_output=True, text=True, cwd=REPO, timeout=60)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert elapsed < 5, f"took {elapsed:.1f} s"  # about 0.3 s, interpreter start included
    [diag] = json.loads(proc.stdout)["diagnostics"]
    assert diag["code"] == "RL008"
    assert "10,000 values" in diag["message"] and "alias" in diag["message"], diag
    assert diag["location"].endswith("yaml_alias_bomb.yaml:8:8"), diag  # the first `*d` of line 8


def test_python_tag_is_refused_by_name_and_line_and_never_run(tmp_path: Path) -> None:
    marker = tmp_path / "created-by-yaml"
    plan = tmp_path / "plan.yaml"
    plan.write_text(f"data:\n  train_files: !!python/object/apply:os.mkdir [{str(marker)!r}]\n")
    result = invoke("validate", str(plan), "--format", "json")
    assert result.exit_code == 2, result.output
    [diag] = json.loads(result.stdout)["diagnostics"]
    assert diag["code"] == "RL007"
    assert "`!!python/object/apply:os.mkdir`" in diag["message"]
    assert diag["location"].endswith("plan.yaml:2:16")
    assert not marker.exists()


def test_unclosed_bracket_points_at_the_bracket_and_at_where_the_parser_gave_up() -> None:
    path = CORPUS / "yaml_unclosed_bracket.yaml"
    result = invoke("validate", str(path), "--format", "json")
    [diag] = json.loads(result.stdout)["diagnostics"]
    assert diag["location"].endswith(":3:11")  # the `[` of `logger: [console, tensorboard`
    assert diag["related"].endswith(":4:9") and diag["related_note"] == "the parser gave up here"
    assert "starts on line 3" in diag["message"] and "(line 4)" in diag["message"]
    text = invoke("validate", str(path)).output
    assert "3 |   logger: [console, tensorboard\n" in text and "4 |   nnodes: 1\n" in text, text
    assert text.index("the `[` list starts here") < text.index("the parser gave up here")


def test_duplicate_key_names_the_line_that_first_set_it() -> None:
    result = invoke("validate", str(CORPUS / "yaml_duplicate_key.yaml"), "--format", "json")
    [diag] = json.loads(result.stdout)["diagnostics"]
    assert "duplicate key `train_batch_size`" in diag["message"] and "line 3" in diag["message"]
    assert diag["location"].endswith(":4:3") and diag["related"].endswith(":3:3")


def test_diagnostics_without_a_second_place_have_no_related_keys_in_json() -> None:
    result = invoke("validate", str(CORPUS / "yaml_python_object_tag.yaml"), "--format", "json")
    [diag] = json.loads(result.stdout)["diagnostics"]
    assert set(diag) == {"code", "severity", "key", "message", "help", "note", "location"}


def test_plan_file_over_the_size_limit_is_refused_without_reading_it_whole(tmp_path: Path) -> None:
    from rlconf.loader import MAX_PLAN_BYTES

    big = tmp_path / "train.jsonl"
    big.write_bytes(b'{"prompt": "x"}\n' * (MAX_PLAN_BYTES // 16 + 1))
    result = invoke("validate", str(big))
    assert result.exit_code == 2, result.output
    assert "error[RL008]" in result.output and "1 MiB" in result.output


# --- paths the compiler looks at: RL009, RL001 for the plan file itself ------------------------
#
# Each key below names a path the compiler stats. Three ways a stat fails with an OSError other than
# "not found": a path too long for the file system, a path through a file (`a_file/x`), and a
# path inside a directory this user may not enter (mode 000). Each must give a located RL009
# (exit 1), never a traceback; a path that merely does not exist passes (a hub id, a cluster file).

# key -> (YAML setting it to {path} on top of the baseline, the path's last component)
PATH_KEYS: dict[str, tuple[str, str]] = {
    "base": ("", "base.yaml"),
    "actor_rollout_ref.model.path": ("actor_rollout_ref:\n  model:\n    path: '{path}'\n", "model"),
    "actor_rollout_ref.model.tokenizer_path": ("actor_rollout_ref:\n  model:\n    tokenizer_path: '{path}'\n", "tokenizer"),
    "data.tokenizer": ("data:\n  tokenizer: '{path}'\n", "tokenizer"),
    "critic.model.path": ("critic:\n  model:\n    path: '{path}'\n", "critic"),
    "critic.model.tokenizer_path": ("critic:\n  model:\n    tokenizer_path: '{path}'\n", "tokenizer"),
    "reward_model.model.path": ("reward_model:\n  model:\n    path: '{path}'\n", "reward_model"),
    "reward_model.model.input_tokenizer": ("reward_model:\n  model:\n    input_tokenizer: '{path}'\n", "tokenizer"),
    "data.train_files": ("data:\n  train_files: '{path}'\n", "train.parquet"),
    "data.val_files[1]": ("data:\n  val_files: [missing/val.parquet, '{path}']\n", "val.parquet"),
    "custom_reward_function.path": ("custom_reward_function:\n  path: '{path}'\n", "reward.py"),
    "trainer.default_local_dir": ("trainer:\n  default_local_dir: '{path}'\n", "run"),
    "trainer.resume_from_path": ("trainer:\n  resume_mode: resume_path\n  resume_from_path: '{path}'\n", "global_step_2"),
    "trainer.resume_mode": ("trainer:\n  resume_mode: '{path}'\n", "global_step_2"),
}
BROKEN_PATHS = ["too_long_name", "too_long_path", "through_a_file", "unreadable_dir"]


def broken_path(kind: str, root: Path, leaf: str) -> str:
    if kind == "too_long_name":  # one name of thousands of characters (over NAME_MAX, 255 here)
        return str(root / ("m" * 3000) / leaf)
    if kind == "too_long_path":  # short names, thousands of characters in all (over PATH_MAX, 4096 here)
        return str(root.joinpath(*["d" * 100] * 50, leaf))
    if kind == "through_a_file":
        (root / "a_file").write_text("not a directory\n")
        return str(root / "a_file" / leaf)
    assert kind == "unreadable_dir"
    (root / "locked").mkdir(exist_ok=True)  # made mode 000 by the caller, after the plans are written
    return str(root / "locked" / leaf)


def write_path_plan(root: Path, key: str, path: str) -> tuple[Path, int]:
    """The baseline with `key` set to `path`: (plan file, the line the diagnostic must point at)."""
    template, _ = PATH_KEYS[key]
    if key == "base":
        text = f"base: '{path}'\n"
    else:
        text = f"base: {BASELINE}\n" + template.format(path=path)
    plan = root / f"{key.replace('[', '_').replace(']', '')}.yaml"
    plan.write_text(text)
    line = next(i for i, row in enumerate(text.splitlines(), 1) if "{path}" not in row and path in row)
    return plan, line


def validate_json(plans: list[Path], cwd: Path, held_to_permissions: bool = False) -> list[tuple[int, dict, str]]:
    """(exit code, JSON payload, text output) of `rlconf validate` on each plan.

    `held_to_permissions`: root reads through mode 000, so as root the plans are validated in a
    child process without the two capabilities that let root ignore permission bits.
    """
    if not (held_to_permissions and os.geteuid() == 0):
        results = []
        for plan in plans:
            as_json, as_text = invoke("validate", str(plan), "--format", "json"), invoke("validate", str(plan))
            results.append((as_json.exit_code, json.loads(as_json.stdout), as_text.output))
        return results
    script = ("import json, os, sys\nfrom typer.testing import CliRunner\nfrom rlconf.cli import app\n"
              "try:\n    os.stat(os.path.join('locked', 'probe'))\nexcept PermissionError:\n    pass\n"
              "else:\n    sys.exit('mode 000 does not stop this process')\n"
              "runner = CliRunner()\nfor plan in sys.argv[1:]:\n"
              "    j, t = runner.invoke(app, ['validate', plan, '--format', 'json']), runner.invoke(app, ['validate', plan])\n"
              "    print(json.dumps([j.exit_code, j.stdout, t.output, repr(j.exception), repr(t.exception)]))\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
    try:
        proc = subprocess.run([sys.executable, "-c", script, *map(str, plans)], capture_output=True, text=True,
                              cwd=cwd, env=env, preexec_fn=drop_permission_override, timeout=120)
    except subprocess.SubprocessError as exc:
        pytest.skip(f"runs as root and cannot drop CAP_DAC_OVERRIDE / CAP_DAC_READ_SEARCH for a child ({exc})")
    if "mode 000 does not stop this process" in proc.stderr:
        pytest.skip("runs as root, and a child without CAP_DAC_OVERRIDE still reads through mode 000")
    assert proc.returncode == 0, proc.stderr
    results = []
    for line in proc.stdout.splitlines():
        exit_code, stdout, text, *exceptions = json.loads(line)
        assert all(e == "None" or e.startswith("SystemExit(") for e in exceptions), exceptions
        results.append((exit_code, json.loads(stdout), text))
    return results


PR_CAPBSET_DROP, CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH = 24, 1, 2  # linux/prctl.h, linux/capability.h


def drop_permission_override() -> None:
    """preexec_fn: take the capabilities that let root ignore permission bits out of the bounding set,
    so the program exec'ed next runs as root held to them (it still owns root's files)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    for cap in (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH):
        if libc.prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_CAPBSET_DROP)")


@contextmanager
def locked_dir(root: Path) -> Iterator[None]:
    """`root/locked` at mode 000 while the body runs (skipped where that does not stop a non-root user)."""
    locked = root / "locked"
    locked.chmod(0o000)
    try:
        if os.geteuid() != 0:
            try:
                os.stat(locked / "probe")
            except PermissionError:
                pass
            except OSError:
                pytest.skip("mode 000 does not deny this user entry into a directory on this file system")
        yield
    finally:
        locked.chmod(0o700)


@pytest.mark.parametrize("kind", BROKEN_PATHS)
def test_every_path_the_compiler_probes_fails_as_rl009_at_its_line(tmp_path: Path, kind: str) -> None:
    cases = {key: write_path_plan(tmp_path, key, broken_path(kind, tmp_path, leaf))
             for key, (_, leaf) in PATH_KEYS.items()}
    with locked_dir(tmp_path) if kind == "unreadable_dir" else nullcontext():
        results = validate_json([plan for plan, _ in cases.values()], tmp_path, kind == "unreadable_dir")
    expected_reason = {"too_long_name": "a file name may have", "too_long_path": "a path may have",
                       "through_a_file": "is a file, not a directory",
                       "unreadable_dir": "permission denied"}[kind]
    for (key, (plan, line)), (exit_code, payload, text) in zip(cases.items(), results):
        assert exit_code == 1, f"{key}: {text}"
        assert "Traceback" not in text, text
        found = [d for d in payload["diagnostics"] if d["code"] == "RL009" and d["key"] == key]
        assert found, f"{key}: {json.dumps(payload['diagnostics'], indent=1)}"
        assert found[0]["location"].endswith(f"{plan.name}:{line}:{found[0]['location'].rsplit(':', 1)[1]}"), found[0]
        assert expected_reason in found[0]["message"], found[0]
        assert f"error[RL009]" in text and f":{line}:" in text, text
        assert max(map(len, text.splitlines())) < 400, f"{key}: a path thousands of characters long is shown whole"


def test_explain_reports_an_over_long_model_path_without_a_traceback(tmp_path: Path) -> None:
    plan, line = write_path_plan(tmp_path, "actor_rollout_ref.model.path", str(tmp_path / ("m" * 4000)))
    for args in (["explain", str(plan)], ["explain", str(plan), "--format", "json"]):
        result = invoke(*args)
        assert result.exit_code == 1, result.output
        assert "RL009" in result.output, result.output


def test_paths_that_do_not_exist_pass(tmp_path: Path) -> None:
    """A hub id, or a file that exists only on the cluster: the compiler cannot tell, so it says nothing."""
    plans = [write_path_plan(tmp_path, key, str(tmp_path / "nowhere" / leaf))[0]
             for key, (_, leaf) in PATH_KEYS.items() if key != "base"]
    for plan, (exit_code, payload, text) in zip(plans, validate_json(plans, tmp_path)):
        assert exit_code == 0, text
        assert payload["diagnostics"] == [], plan.read_text()


@pytest.mark.parametrize("kind", BROKEN_PATHS)
def test_an_unusable_plan_file_path_is_rl001_exit_2(tmp_path: Path, kind: str) -> None:
    plan = Path(broken_path(kind, tmp_path, "plan.yaml"))
    with locked_dir(tmp_path) if kind == "unreadable_dir" else nullcontext():
        results = validate_json([plan], tmp_path, kind == "unreadable_dir")
    exit_code, payload, text = results[0]
    assert exit_code == 2, text
    assert [d["code"] for d in payload["diagnostics"]] == ["RL001"], payload
    assert "Traceback" not in text and max(map(len, text.splitlines())) < 400, text


def test_a_source_line_longer_than_the_cut_shows_its_start_and_its_length() -> None:
    """A 300-character line with the value at column 11: the snippet keeps the first 120 characters,
    says how long the line was, and the caret stops at the cut (110 = 120 - 10 columns before it).
    A place that starts past the cut gets no snippet (its caret would point at nothing shown)."""
    from rlconf.diagnostics import error
    from rlconf.sources import Location, SourceMap
    from rlconf.render import SHOWN_LINE_CHARS, diagnostic_pieces

    assert SHOWN_LINE_CHARS == 120
    line = "    path: " + "m" * 290  # 300 characters, the value from column 11 to 300
    sources = SourceMap(lines={"plan.yaml": ["x: 1", line]})
    d = error("RL009", "k", "too long").at(Location("plan.yaml", 2, 11, 301))
    text = "".join(piece for piece, _ in diagnostic_pieces(d, sources))
    shown = "2 | " + line[:120] + "… (300 characters)\n"
    assert shown in text, text
    assert "  | " + " " * 10 + "^" * 110 + "\n" in text, text
    past = error("RL009", "k", "too long").at(Location("plan.yaml", 2, 121, 301))
    text = "".join(piece for piece, _ in diagnostic_pieces(past, sources))
    assert "plan.yaml:2:121" in text and "mmm" not in text, text
