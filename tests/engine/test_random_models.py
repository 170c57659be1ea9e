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
    tiny.build_random_model(name, tmp_path)
    shape = MODEL_SHAPES[RANDOM_TWINS[name]]
    assert calls == [{
        "arch": shape["model_type"], "hidden_size": shape["hidden_size"], "num_layers": shape["num_hidden_layers"],
        "num_heads": shape["num_attention_heads"], "num_kv_heads": shape["num_key_value_heads"],
        "intermediate_size": shape["intermediate_size"], "max_position_embeddings": shape["max_position_embeddings"],
        "seed": 0, "vocab_size": shape["vocab_size"], "tie_word_embeddings": shape["tie_word_embeddings"],
        "rope_theta": shape["rope_theta"], "weights_dtype": "bfloat16", "full_vocabulary": False}]


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
