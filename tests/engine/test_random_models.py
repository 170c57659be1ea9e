"""`random://NAME` models are built in the shape rlconf's table holds for NAME's twin repo
(rlconf.modelinfo.RANDOM_TWINS; the builder is stubbed there: these shapes take minutes to draw on a CPU), on the GPU
with the most free memory where one has room, in a process of its own, the CPU the fallback (a small shape)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import engine.models.tiny as tiny
from rlconf.model_shapes import MODEL_SHAPES
from rlconf.modelinfo import RANDOM_TWINS


@pytest.mark.parametrize("name", sorted(RANDOM_TWINS))
def test_random_model_is_built_in_its_twins_shape(name: str, tmp_path: Path, monkeypatch):
    calls = []
    monkeypatch.setattr(tiny, "build_tiny_model", lambda out_dir, **kwargs: calls.append(kwargs) or Path(out_dir))
    monkeypatch.setattr(tiny, "gpu_for_draw", lambda need_bytes: None)
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
    """A machine whose GPU cannot take the draw (here: a CUDA draw asked of a machine without CUDA, failing in its
    process) still gets its model, and the next launch finds it instead of trying the GPU again."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the CUDA draw would succeed")
    monkeypatch.setattr(tiny, "gpu_for_draw", lambda need_bytes: "0")
    small_shape = {"model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "num_key_value_heads": 2, "intermediate_size": 128, "max_position_embeddings": 512,
                   "vocab_size": 1024, "tie_word_embeddings": True, "rope_theta": 10000.0}
    import rlconf.modelinfo as modelinfo

    monkeypatch.setattr(modelinfo, "random_shape", lambda path: small_shape)
    out = tiny.build_random_model("Qwen2.5-0.5B", tmp_path / "m")
    assert "the draw on GPU 0 failed" in capsys.readouterr().out
    assert "init_device" not in (out / tiny.MARKER_FILE).read_text()  # the CPU's draw, under a CPU build's marker

    def no_second_build(*args, **kwargs):
        raise AssertionError("built again")

    monkeypatch.setattr(tiny, "build_in_child", no_second_build)
    monkeypatch.setattr(tiny, "build_tiny_model", no_second_build)
    assert tiny.build_random_model("Qwen2.5-0.5B", tmp_path / "m") == out


FAKE_SMI_FREE = """#!{python}
import os, sys
assert "--query-gpu=index,memory.free" in sys.argv, sys.argv
for index, free in enumerate(os.environ["FAKE_SMI_FREE_MIB"].split(",")):
    print(f"{{index}}, {{free}}")
"""


def test_the_draw_goes_to_the_visible_gpu_with_the_most_free_memory_if_it_has_room(tmp_path: Path, monkeypatch):
    import stat
    import sys

    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI_FREE.format(python=sys.executable))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{tmp_path}:{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_FREE_MIB", "1000,40000,30000")
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    gib = 2**30
    assert tiny.gpu_for_draw(35 * gib) == "1"
    assert tiny.gpu_for_draw(45 * gib) is None  # none has room: the CPU draws
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "2,0")
    assert tiny.gpu_for_draw(20 * gib) == "2"  # GPU 1 is not this process's
    assert tiny.gpu_for_draw(35 * gib) is None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-5e1f")
    assert tiny.gpu_for_draw(1) is None
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert tiny.gpu_for_draw(1) is None  # no nvidia-smi


def test_an_init_device_other_than_cpu_or_cuda_is_refused(tmp_path: Path):
    with pytest.raises(ValueError, match="init_device must be one of"):
        tiny.build_tiny_model(tmp_path / "m", **SMALL, init_device="cuda:1")


@pytest.mark.gpu
def test_on_a_gpu_the_draw_runs_there_in_a_process_of_its_own(tmp_path: Path):
    import subprocess
    import sys

    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    # In a fresh process: whether the caller initialised CUDA, which other GPU tests of this session have done here.
    script = ("import sys, torch; import engine.models.tiny as t; "
              "out = t.build_random_model('Qwen2.5-0.5B', sys.argv[1]); print(torch.cuda.is_initialized())")
    proc = subprocess.run([sys.executable, "-c", script, str(tmp_path / "m")], capture_output=True, text=True,
                          timeout=600, env=dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in sys.path if p)))
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip().splitlines()[-1] == "False"  # the draw's CUDA context died with its process
    out = tmp_path / "m"
    assert '"init_device": "cuda"' in (out / tiny.MARKER_FILE).read_text()
    embed = _weights(out)["model.embed_tokens.weight"].float()
    assert embed.shape == (151936, 896) and 0.015 < embed.std().item() < 0.025  # Qwen2's initializer_range 0.02
    # the GPU's draw, not the CPU's under a GPU marker; and the same settings give the same bytes on this GPU
    on_gpu = _weights(tiny.build_in_child(tmp_path / "gpu", SMALL, "cuda"))
    again = _weights(tiny.build_in_child(tmp_path / "gpu_again", SMALL, "cuda"))
    on_cpu = _weights(tiny.build_tiny_model(tmp_path / "cpu", **SMALL))
    assert all(torch.equal(on_gpu[k], again[k]) for k in on_gpu)
    assert not torch.equal(on_gpu["model.embed_tokens.weight"], on_cpu["model.embed_tokens.weight"])
