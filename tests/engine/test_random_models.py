"""`random://NAME` models are built in the shape rlconf's table holds for NAME's twin repo
(rlconf.modelinfo.RANDOM_TWINS); the builder itself is stubbed: these shapes take minutes to build."""

from __future__ import annotations

from pathlib import Path

import pytest

import engine.models.tiny as tiny
from rlconf.model_shapes import MODEL_SHAPES
from rlconf.modelinfo import RANDOM_TWINS


@pytest.mark.parametrize("name", sorted(RANDOM_TWINS))
def test_random_model_is_built_in_its_twins_shape(name: str, tmp_path: Path, monkeypatch):
    calls = []
    monkeypatch.setattr(tiny, "build_tiny_model", lambda out_dir, **kwargs: calls.append(kwargs) or Path(out_dir))
    monkeypatch.setattr(tiny, "cuda_available", lambda: False)
    tiny.build_random_model(name, tmp_path)
    shape = MODEL_SHAPES[RANDOM_TWINS[name]]
    assert calls == [{
        "arch": shape["model_type"], "hidden_size": shape["hidden_size"], "num_layers": shape["num_hidden_layers"],
        "num_heads": shape["num_attention_heads"], "num_kv_heads": shape["num_key_value_heads"],
        "intermediate_size": shape["intermediate_size"], "max_position_embeddings": shape["max_position_embeddings"],
        "seed": 0, "vocab_size": shape["vocab_size"], "tie_word_embeddings": shape["tie_word_embeddings"],
        "rope_theta": shape["rope_theta"], "weights_dtype": "bfloat16", "full_vocabulary": False,
        "init_device": "cpu"}]  # no GPU here: the draw runs on the CPU


def test_an_unknown_random_name_lists_the_known_ones(tmp_path: Path):
    with pytest.raises(ValueError, match="Qwen2.5-0.5B, Qwen2.5-1.5B"):
        tiny.build_random_model("Qwen9-1T", tmp_path)


def test_a_full_vocabulary_tokenizer_writes_every_sampled_id_as_text_of_as_many_tokens():
    """A random model samples any id of its vocabulary: with the placeholders each decodes to text, and the text
    re-tokenizes to the same ids (what a reward model re-reading the responses sees)."""
    import random

    tokenizer = tiny.build_tokenizer(vocab_size=2000)
    assert len(tokenizer) == 2000 and len(tiny.build_tokenizer()) < 2000
    ids = random.Random(1).sample(range(len(tiny.build_tokenizer()), 2000), 64)
    assert tokenizer(tokenizer.decode(ids), add_special_tokens=False)["input_ids"] == ids


SMALL = dict(arch="qwen2", hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2, intermediate_size=128,
             max_position_embeddings=512, seed=3, vocab_size=1024, weights_dtype="bfloat16")


def _weights(path: Path) -> dict:
    from safetensors.torch import load_file

    (file,) = path.glob("*.safetensors")
    return load_file(file)


def test_a_build_in_a_child_process_writes_the_bytes_of_the_same_build_in_this_one(tmp_path: Path):
    import torch

    tiny.build_in_child(tmp_path / "child", SMALL, "cpu")
    tiny.build_tiny_model(tmp_path / "here", **SMALL)
    child, here = _weights(tmp_path / "child"), _weights(tmp_path / "here")
    assert child.keys() == here.keys() and all(torch.equal(child[k], here[k]) for k in here)
    assert (tmp_path / "child" / tiny.MARKER_FILE).read_text() == (tmp_path / "here" / tiny.MARKER_FILE).read_text()


def test_a_child_that_fails_says_why(tmp_path: Path):
    with pytest.raises(RuntimeError, match="ValueError: arch must be"):
        tiny.build_in_child(tmp_path / "bad", {**SMALL, "arch": "gpt9"}, "cpu")


def test_when_the_gpu_draw_fails_the_cpu_draws_and_a_later_call_keeps_that_build(tmp_path: Path, monkeypatch, capsys):
    """A machine whose GPU cannot take the draw (here: a CUDA build asked of a machine without CUDA, failing in the
    child) still gets its model, and the next launch finds it instead of trying the GPU again."""
    import torch

    monkeypatch.setattr(tiny, "cuda_available", lambda: True)
    small_shape = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 512,
                   "vocab_size": 1024, "tie_word_embeddings": True, "rope_theta": 10000.0}
    import rlconf.modelinfo as modelinfo
    monkeypatch.setattr(modelinfo, "random_shape", lambda path: small_shape)
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CUDA draw would succeed")
    out = tiny.build_random_model("Qwen2.5-0.5B", tmp_path / "m")
    assert "the draw on the GPU failed" in capsys.readouterr().out
    marker = (out / tiny.MARKER_FILE).read_text()
    assert "init_device" not in marker  # the CPU's draw, under the marker a CPU build always had

    def no_second_build(*args, **kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(tiny, "build_in_child", no_second_build)
    monkeypatch.setattr(tiny, "build_tiny_model", no_second_build)
    assert tiny.build_random_model("Qwen2.5-0.5B", tmp_path / "m") == out


@pytest.mark.gpu
def test_on_a_gpu_the_draw_runs_there_in_a_child_and_leaves_this_process_without_cuda(tmp_path: Path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    out = tiny.build_random_model("Qwen2.5-0.5B", tmp_path / "m")
    assert '"init_device": "cuda"' in (out / tiny.MARKER_FILE).read_text()
    assert not torch.cuda.is_initialized()  # the draw's context died with its process
    weights = _weights(out)
    embed = weights["model.embed_tokens.weight"].float()
    assert embed.shape == (151936, 896) and 0.015 < embed.std().item() < 0.025  # Qwen2's initializer_range 0.02
    again = tiny.build_in_child(tmp_path / "again", tiny.random_model_kwargs("Qwen2.5-0.5B"), "cuda")  # same seed
    assert torch.equal(_weights(again)["model.embed_tokens.weight"], weights["model.embed_tokens.weight"])
