"""Tests for the tiny offline model, the RL datasets and the rule rewards."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
pytest.importorskip("pyarrow")

from engine.data.gsm8k import INSTRUCTION, convert_gsm8k_jsonl  # noqa: E402
from engine.data.synthetic import (  # noqa: E402
    DATA_SOURCE,
    TARGET_WORDS,
    make_synthetic_dataset,
    read_parquet,
    write_parquet,
)
from engine.models.tiny import MARKER_FILE, build_tiny_model  # noqa: E402
from engine.rewards import gsm8k as gsm8k_reward  # noqa: E402
from engine.rewards import math_boxed, synthetic  # noqa: E402
from engine.rewards.registry import (  # noqa: E402
    KNOWN_DATA_SOURCES,
    UnknownDataSourceError,
    default_compute_score,
    load_custom_reward_function,
)

VERL_COLUMNS = {"data_source", "prompt", "ability", "reward_model", "extra_info"}


@pytest.fixture(scope="module")
def tiny(tiny_model_dir: Path):
    """(model, tokenizer) loaded once per module, offline only."""
    model = transformers.AutoModelForCausalLM.from_pretrained(tiny_model_dir, local_files_only=True)
    tok = transformers.AutoTokenizer.from_pretrained(tiny_model_dir, local_files_only=True)
    model.eval()
    return model, tok


def _prompt_ids(tok, row: dict) -> list[int]:
    text = tok.apply_chat_template(row["prompt"], tokenize=False, add_generation_prompt=True)
    return tok(text, add_special_tokens=False)["input_ids"]


# --- tiny model / tokenizer -------------------------------------------------


def test_tiny_model_loads_offline_and_generates(tiny) -> None:
    model, tok = tiny
    assert model.config.model_type == "qwen2"
    assert len(tok) == model.config.vocab_size <= 512
    assert tok.pad_token_id is not None and tok.eos_token_id is not None and tok.bos_token_id is not None
    ids = torch.tensor([_prompt_ids(tok, make_synthetic_dataset(1, 0)[0])])
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=6, do_sample=False, pad_token_id=tok.pad_token_id)
    assert out.shape[0] == 1 and ids.shape[1] < out.shape[1] <= ids.shape[1] + 6
    assert isinstance(tok.decode(out[0, ids.shape[1] :], skip_special_tokens=True), str)


def test_build_is_idempotent_and_llama_variant_loads(tiny_model_dir: Path, tmp_path: Path) -> None:
    weights = next(tiny_model_dir.glob("*.safetensors"))
    before = weights.stat().st_mtime_ns
    assert build_tiny_model(tiny_model_dir, arch="qwen2") == tiny_model_dir
    assert weights.stat().st_mtime_ns == before  # same settings: nothing rewritten
    marker = json.loads((tiny_model_dir / MARKER_FILE).read_text())
    assert marker["arch"] == "qwen2" and marker["hidden_size"] == 64

    llama_dir = build_tiny_model(tmp_path / "llama", arch="llama", num_layers=1)
    model = transformers.AutoModelForCausalLM.from_pretrained(llama_dir, local_files_only=True)
    tok = transformers.AutoTokenizer.from_pretrained(llama_dir, local_files_only=True)
    assert type(model).__name__ == "LlamaForCausalLM" and len(tok) == model.config.vocab_size
    with pytest.raises(ValueError, match="arch"):
        build_tiny_model(tmp_path / "bad", arch="gpt2")


def test_chat_template_renders(tiny) -> None:
    _, tok = tiny
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "say red"}]
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|im_start|>system\nbe brief<|im_end|>\n"
        "<|im_start|>user\nsay red<|im_end|>\n"
        "<|im_start|>assistant\n"
    )
    no_gen = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    assert no_gen == text.removesuffix("<|im_start|>assistant\n")


def test_tokenizer_round_trips_task_text(tiny) -> None:
    _, tok = tiny
    texts = [row["prompt"][0]["content"] for row in make_synthetic_dataset(60, 1)]
    texts += ["Natalia sold 48/2 = 24 clips. #### 1,234", "so \\boxed{\\frac{1}{2}}", INSTRUCTION]
    for text in texts:
        ids = tok(text, add_special_tokens=False)["input_ids"]
        assert tok.unk_token_id not in ids
        assert tok.decode(ids) == text
    for word in TARGET_WORDS:  # the task relies on each target being ONE token
        assert len(tok(word, add_special_tokens=False)["input_ids"]) == 1, word


# --- datasets ----------------------------------------------------------------


def test_synthetic_dataset_deterministic_and_parquet_round_trip(tmp_path: Path) -> None:
    rows = make_synthetic_dataset(40, seed=7)
    assert rows == make_synthetic_dataset(40, seed=7)
    assert rows != make_synthetic_dataset(40, seed=8)
    assert {r["reward_model"]["ground_truth"] for r in rows} <= set(TARGET_WORDS)
    for i, row in enumerate(rows):
        assert set(row) == VERL_COLUMNS and row["data_source"] == DATA_SOURCE
        assert row["prompt"][0]["role"] == "user"
        assert row["reward_model"]["ground_truth"] in row["prompt"][0]["content"]
        assert row["extra_info"] == {"split": "train", "index": i}
    back = read_parquet(write_parquet(rows, tmp_path / "sub" / "train.parquet"))
    assert back == rows
    with pytest.raises(ValueError):
        make_synthetic_dataset(-1)


def test_a_parquet_write_cut_short_leaves_no_file_that_looks_complete(tmp_path: Path, monkeypatch) -> None:
    import pyarrow.parquet as pq

    def write_half_then_die(table, where, **kwargs) -> None:
        Path(where).write_bytes(b"PAR1 half a file")
        raise KeyboardInterrupt  # the launch stopped mid-write

    monkeypatch.setattr(pq, "write_table", write_half_then_die)
    with pytest.raises(KeyboardInterrupt):
        write_parquet(make_synthetic_dataset(4, seed=0), tmp_path / "train.parquet")
    assert list(tmp_path.iterdir()) == []  # neither the target nor the partial file


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_gsm8k_conversion(tmp_path: Path) -> None:
    src = _write_jsonl(
        tmp_path / "gsm8k.jsonl",
        [
            json.dumps({"question": "What is 2+2?", "answer": "2+2=4\n#### 4"}),
            "",
            json.dumps({"question": "Big?", "answer": "lots\n#### 1,234"}),
        ],
    )
    assert convert_gsm8k_jsonl(src, tmp_path / "test.parquet", "test") == 2
    rows = read_parquet(tmp_path / "test.parquet")
    assert [set(r) for r in rows] == [VERL_COLUMNS] * 2
    assert rows[0]["data_source"] == "openai/gsm8k"
    assert rows[0]["prompt"] == [{"role": "user", "content": f"What is 2+2? {INSTRUCTION}"}]
    assert "####" in rows[0]["prompt"][0]["content"]
    assert [r["reward_model"] for r in rows] == [
        {"style": "rule", "ground_truth": "4"},
        {"style": "rule", "ground_truth": "1234"},
    ]
    assert rows[1]["extra_info"]["split"] == "test" and rows[1]["extra_info"]["index"] == 1


@pytest.mark.parametrize(
    ("bad_line", "message"),
    [
        ("{not json", "not valid JSON"),
        (json.dumps({"question": "q"}), "answer"),
        (json.dumps({"question": "q", "answer": "no final marker"}), "####"),
        (json.dumps(["a", "list"]), "JSON object"),
    ],
)
def test_gsm8k_malformed_line_names_line_number(tmp_path: Path, bad_line: str, message: str) -> None:
    good = json.dumps({"question": "q", "answer": "#### 1"})
    src = _write_jsonl(tmp_path / "bad.jsonl", [good, good, bad_line])
    with pytest.raises(ValueError, match=rf"line 3\b.*{message}|{message}.*line 3\b") as info:
        convert_gsm8k_jsonl(src, tmp_path / "out.parquet", "train")
    assert "bad.jsonl" in str(info.value)
    assert not (tmp_path / "out.parquet").exists()


# --- rewards -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("response", "truth", "method", "expected"),
    [
        ("3 + 4 = 7\n#### 7", "7", "strict", 1.0),
        ("#### 1,234", "1234", "strict", 1.0),
        ("#### 72.0", "72", "strict", 1.0),
        ("#### 5 ... actually #### 6", "6", "strict", 1.0),  # last answer wins
        ("#### 8", "7", "strict", 0.0),
        ("the answer is 7", "7", "strict", 0.0),  # missing "####"
        ("the answer is 7", "7", "flexible", 1.0),
        ("no numbers here.", "7", "flexible", 0.0),
        ("#### -3", "-3", "strict", 1.0),
    ],
)
def test_gsm8k_scorer(response: str, truth: str, method: str, expected: float) -> None:
    assert gsm8k_reward.compute_score(response, truth, method=method) == expected


def test_gsm8k_format_score() -> None:
    assert gsm8k_reward.compute_score("#### 8", "7", format_score=0.1) == 0.1
    assert gsm8k_reward.compute_score("no answer", "7", format_score=0.1) == 0.0


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [
        ("so the answer is \\boxed{42}.", "42", 1.0),
        ("\\boxed{\\frac{1}{2}}", "\\frac{1}{2}", 1.0),  # nested braces
        ("\\boxed{\\dfrac{1}{2}}", "1/2", 1.0),
        ("\\boxed{0.5}", "\\frac12", 1.0),
        ("\\boxed{ 5.0 }", "5", 1.0),
        ("\\boxed{x = 3}", "3", 1.0),
        ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt3}{2}", 1.0),
        ("\\boxed{1} then \\boxed{2}", "2", 1.0),  # last box wins
        ("\\boxed{3}", "4", 0.0),
        ("the answer is 4", "4", 0.0),  # no box
        ("\\boxed{\\frac{1}{2}", "1/2", 0.0),  # unbalanced: truncated output
        ("\\boxed{(1,2)}", "12", 0.0),
        ("\\boxed{7}", "The answer is $\\boxed{7}$.", 1.0),  # reference solution as truth
    ],
)
def test_math_boxed_scorer(response: str, truth: str, expected: float) -> None:
    assert math_boxed.compute_score(response, truth) == expected


def test_last_boxed_only_string_nested() -> None:
    assert math_boxed.last_boxed_only_string("a \\boxed{\\frac{a}{\\sqrt{b}}} z") == "\\boxed{\\frac{a}{\\sqrt{b}}}"
    assert math_boxed.last_boxed_only_string("nothing") is None


@pytest.mark.parametrize(
    ("response", "expected"),
    [("red", 1.0), ("  red<|im_end|>", 1.0), ("redblue", 1.0), ("blue red", 0.5), ("blue", 0.0), ("", 0.0)],
)
def test_synthetic_scorer(response: str, expected: float) -> None:
    assert synthetic.compute_score(response, "red") == expected


def test_dispatch_by_data_source() -> None:
    assert default_compute_score("openai/gsm8k", "#### 3", "3") == 1.0
    for source in ("lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "math"):
        assert default_compute_score(source, "\\boxed{3}", "3", extra_info={"index": 0}) == 1.0
    assert default_compute_score(DATA_SOURCE, "cat", "cat") == 1.0
    with pytest.raises(UnknownDataSourceError) as info:
        default_compute_score("nope/unknown", "x", "y")
    assert isinstance(info.value, NotImplementedError)  # what verl raises
    assert "nope/unknown" in str(info.value)
    assert all(source in str(info.value) for source in KNOWN_DATA_SOURCES)


def test_load_custom_reward_function(tmp_path: Path) -> None:
    path = tmp_path / "my_reward.py"
    path.write_text(
        "LIMIT = 3\n"
        "def score(data_source, solution_str, ground_truth, extra_info=None):\n"
        "    return float(solution_str == ground_truth)\n"
    )
    fn = load_custom_reward_function(path, "score")
    assert fn("d", "a", "a") == 1.0 and fn("d", "a", "b") == 0.0
    with pytest.raises(FileNotFoundError, match="missing.py"):
        load_custom_reward_function(tmp_path / "missing.py", "score")
    with pytest.raises(AttributeError, match="nope.*score"):
        load_custom_reward_function(path, "nope")
    with pytest.raises(TypeError, match="not a callable"):
        load_custom_reward_function(path, "LIMIT")
    broken = tmp_path / "broken.py"
    broken.write_text("raise RuntimeError('boom')\n")
    with pytest.raises(ImportError, match="boom"):
        load_custom_reward_function(broken, "score")


# --- the synthetic task is learnable from a random policy ---------------------


def test_random_policy_has_nonzero_expected_reward(tiny) -> None:
    """Exact first-token term of E[reward] under the untrained model is clearly > 0.

    E[reward] >= P(first token == target) * 1.0, and the target is one token, so
    the softmax at the generation position gives that probability directly (no
    sampling noise). A near-uniform random model gives about 1/|vocab|.
    """
    model, tok = tiny
    rows = make_synthetic_dataset(16, seed=3)
    probs = []
    with torch.no_grad():
        for row in rows:
            ids = torch.tensor([_prompt_ids(tok, row)])
            target_id = tok(row["reward_model"]["ground_truth"], add_special_tokens=False)["input_ids"][0]
            p = torch.softmax(model(ids).logits[0, -1].float(), dim=-1)[target_id].item()
            probs.append(p)
    expected_lower_bound = sum(probs) / len(probs)
    vocab = model.config.vocab_size
    assert expected_lower_bound > 0.25 / vocab, (expected_lower_bound, vocab)
    # Analytically, a uniform policy hits full credit with probability 1/|vocab|,
    # so a GRPO group of 8 over 64 prompts sees ~1 full-credit sample per step.
    assert math.isclose(synthetic.compute_score(tok.decode([target_id]), tok.decode([target_id])), 1.0)
