"""The shapes of the models plans name most, keyed by their hub repo id.

A plan names a hub model (`Qwen/Qwen2.5-7B-Instruct`) that is seldom downloaded where `rlconf
validate` runs. Without its shape the memory estimate leaves out activations and logits, the largest
training term, and the rules that read heads or positions cannot run. rlconf.modelinfo falls back to
this table when neither a local directory nor the HF cache holds the model's config.json.

Each entry holds the config.json fields the estimate and the rules read, as the repo's config.json
(`config_url`) has them: head_dim for the families whose configs set it (Qwen3, Gemma; in some sizes
it is not hidden_size ÷ num_attention_heads), rope_theta where it was checked (a random:// model is
built with it). They were checked in three ways: the
parameter count they give equals the count the Hub publishes for the repo (its safetensors metadata;
tests/compiler/test_model_shapes.py), they agree with torchtune's and mlc-llm's model definitions
of the same models, and base and instruct repos differ where their configs do (Qwen2.5 instruct
models keep 32k positions where the 1.5B to 72B base models have 128k).

Left out: Gemma 3 at 4B and above (image-text models, whose decoder layers sit where the engine's
FSDP does not look for them) and every model whose numbers could not be checked.
"""

from __future__ import annotations

from functools import partial
from pathlib import PurePosixPath


def _decoder(model_type: str, *, hidden: int, layers: int, heads: int, kv_heads: int, intermediate: int, vocab: int,
             tied: bool, **more: object) -> dict:
    """One decoder's numbers under config.json's names (`more`: head_dim, rope_theta, max_position_embeddings)."""
    return {"model_type": model_type, "hidden_size": hidden, "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "intermediate_size": intermediate, "vocab_size": vocab,
            "tie_word_embeddings": tied, **more}


def _distill(base: dict, **changes: object) -> dict:
    """A DeepSeek-R1 distill: its base's shape with 128k positions; rope_theta only where it was checked."""
    return {**{k: v for k, v in base.items() if k != "rope_theta"}, "max_position_embeddings": 131072, **changes}


_qwen2_5 = partial(_decoder, "qwen2", rope_theta=1000000.0)
_QWEN2_5_0_5B = _qwen2_5(hidden=896, layers=24, heads=14, kv_heads=2, intermediate=4864, vocab=151936, tied=True)
_QWEN2_5_1_5B = _qwen2_5(hidden=1536, layers=28, heads=12, kv_heads=2, intermediate=8960, vocab=151936, tied=True)
_QWEN2_5_3B = _qwen2_5(hidden=2048, layers=36, heads=16, kv_heads=2, intermediate=11008, vocab=151936, tied=True)
_QWEN2_5_7B = _qwen2_5(hidden=3584, layers=28, heads=28, kv_heads=4, intermediate=18944, vocab=152064, tied=False)
_QWEN2_5_14B = _qwen2_5(hidden=5120, layers=48, heads=40, kv_heads=8, intermediate=13824, vocab=152064, tied=False)
_QWEN2_5_32B = _qwen2_5(hidden=5120, layers=64, heads=40, kv_heads=8, intermediate=27648, vocab=152064, tied=False)
_QWEN2_5_72B = _qwen2_5(hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=29568, vocab=152064, tied=False)
# Qwen3's attention is 128 wide per head whatever the hidden size (head_dim is in every config.json).
_qwen3 = partial(_decoder, "qwen3", vocab=151936, head_dim=128, rope_theta=1000000.0)
_QWEN3_0_6B = _qwen3(hidden=1024, layers=28, heads=16, kv_heads=8, intermediate=3072, tied=True)
_QWEN3_1_7B = _qwen3(hidden=2048, layers=28, heads=16, kv_heads=8, intermediate=6144, tied=True)
_QWEN3_4B = _qwen3(hidden=2560, layers=36, heads=32, kv_heads=8, intermediate=9728, tied=True)
_QWEN3_8B = _qwen3(hidden=4096, layers=36, heads=32, kv_heads=8, intermediate=12288, tied=False)
_QWEN3_14B = _qwen3(hidden=5120, layers=40, heads=40, kv_heads=8, intermediate=17408, tied=False)
_QWEN3_32B = _qwen3(hidden=5120, layers=64, heads=64, kv_heads=8, intermediate=25600, tied=False)
_llama3 = partial(_decoder, "llama", vocab=128256, max_position_embeddings=131072, rope_theta=500000.0)
_LLAMA3_1_8B = _llama3(hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, tied=False)
_LLAMA3_1_70B = _llama3(hidden=8192, layers=80, heads=64, kv_heads=8, intermediate=28672, tied=False)
_LLAMA3_2_1B = _llama3(hidden=2048, layers=16, heads=32, kv_heads=8, intermediate=8192, tied=True)
_LLAMA3_2_3B = _llama3(hidden=3072, layers=28, heads=24, kv_heads=8, intermediate=8192, tied=True)
_mistral_7b = partial(_decoder, "mistral", hidden=4096, layers=32, heads=32, kv_heads=8, intermediate=14336, tied=False,
                      max_position_embeddings=32768)
# Gemma ties its embeddings (the configs leave tie_word_embeddings at the class default, true).
_gemma2 = partial(_decoder, "gemma2", vocab=256000, tied=True, max_position_embeddings=8192, rope_theta=10000.0)
_GEMMA2_2B = _gemma2(hidden=2304, layers=26, heads=8, kv_heads=4, head_dim=256, intermediate=9216)
_GEMMA2_9B = _gemma2(hidden=3584, layers=42, heads=16, kv_heads=8, head_dim=256, intermediate=14336)
_GEMMA2_27B = _gemma2(hidden=4608, layers=46, heads=32, kv_heads=16, head_dim=128, intermediate=36864)

_GEMMA3_1B = _decoder("gemma3_text", hidden=1152, layers=26, heads=4, kv_heads=1, head_dim=256, intermediate=6912,
                      vocab=262144, tied=True, max_position_embeddings=32768, rope_theta=1000000.0)

MODEL_SHAPES: dict[str, dict] = {
    # Qwen2.5: instruct models keep 32k positions; the base models from 1.5B up have 128k.
    "Qwen/Qwen2.5-0.5B": {**_QWEN2_5_0_5B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-0.5B-Instruct": {**_QWEN2_5_0_5B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-1.5B": {**_QWEN2_5_1_5B, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-1.5B-Instruct": {**_QWEN2_5_1_5B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-3B": {**_QWEN2_5_3B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-3B-Instruct": {**_QWEN2_5_3B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-7B": {**_QWEN2_5_7B, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-7B-Instruct": {**_QWEN2_5_7B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-14B": {**_QWEN2_5_14B, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-14B-Instruct": {**_QWEN2_5_14B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-32B": {**_QWEN2_5_32B, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-32B-Instruct": {**_QWEN2_5_32B, "max_position_embeddings": 32768},
    "Qwen/Qwen2.5-72B": {**_QWEN2_5_72B, "max_position_embeddings": 131072},
    "Qwen/Qwen2.5-72B-Instruct": {**_QWEN2_5_72B, "max_position_embeddings": 32768},
    # Qwen3 dense: the post-trained models (no suffix) have 40k positions, the -Base ones 32k.
    "Qwen/Qwen3-0.6B": {**_QWEN3_0_6B, "max_position_embeddings": 40960},
    "Qwen/Qwen3-0.6B-Base": {**_QWEN3_0_6B, "max_position_embeddings": 32768},
    "Qwen/Qwen3-1.7B": {**_QWEN3_1_7B, "max_position_embeddings": 40960},
    "Qwen/Qwen3-1.7B-Base": {**_QWEN3_1_7B, "max_position_embeddings": 32768},
    "Qwen/Qwen3-4B": {**_QWEN3_4B, "max_position_embeddings": 40960},
    "Qwen/Qwen3-4B-Base": {**_QWEN3_4B, "max_position_embeddings": 32768},
    "Qwen/Qwen3-8B": {**_QWEN3_8B, "max_position_embeddings": 40960},
    "Qwen/Qwen3-8B-Base": {**_QWEN3_8B, "max_position_embeddings": 32768},
    "Qwen/Qwen3-14B": {**_QWEN3_14B, "max_position_embeddings": 40960},
    "Qwen/Qwen3-14B-Base": {**_QWEN3_14B, "max_position_embeddings": 32768},
    "Qwen/Qwen3-32B": {**_QWEN3_32B, "max_position_embeddings": 40960},
    # Llama 3.1 under its current and its first (Meta-) names; 3.3 70B is 3.1 70B's architecture.
    "meta-llama/Llama-3.1-8B": _LLAMA3_1_8B,
    "meta-llama/Llama-3.1-8B-Instruct": _LLAMA3_1_8B,
    "meta-llama/Meta-Llama-3.1-8B": _LLAMA3_1_8B,
    "meta-llama/Meta-Llama-3.1-8B-Instruct": _LLAMA3_1_8B,
    "meta-llama/Llama-3.1-70B": _LLAMA3_1_70B,
    "meta-llama/Llama-3.1-70B-Instruct": _LLAMA3_1_70B,
    "meta-llama/Meta-Llama-3.1-70B": _LLAMA3_1_70B,
    "meta-llama/Meta-Llama-3.1-70B-Instruct": _LLAMA3_1_70B,
    "meta-llama/Llama-3.2-1B": _LLAMA3_2_1B,
    "meta-llama/Llama-3.2-1B-Instruct": _LLAMA3_2_1B,
    "meta-llama/Llama-3.2-3B": _LLAMA3_2_3B,
    "meta-llama/Llama-3.2-3B-Instruct": _LLAMA3_2_3B,
    "meta-llama/Llama-3.3-70B-Instruct": _LLAMA3_1_70B,
    # Mistral 7B: v0.3 grew the vocabulary to 32768; v0.2 and v0.3 dropped the 4k sliding window.
    "mistralai/Mistral-7B-v0.1": _mistral_7b(vocab=32000, rope_theta=10000.0),
    "mistralai/Mistral-7B-Instruct-v0.1": _mistral_7b(vocab=32000, rope_theta=10000.0),
    "mistralai/Mistral-7B-Instruct-v0.2": _mistral_7b(vocab=32000),
    "mistralai/Mistral-7B-v0.3": _mistral_7b(vocab=32768, rope_theta=1000000.0),
    "mistralai/Mistral-7B-Instruct-v0.3": _mistral_7b(vocab=32768, rope_theta=1000000.0),
    # DeepSeek-R1 distills; the 1.5B and 7B come from Qwen2.5-Math, and the 1.5B has an LM head of its own.
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-1.5B": _distill(_QWEN2_5_1_5B, tie_word_embeddings=False, rope_theta=10000.0),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-7B": _distill(_QWEN2_5_7B, rope_theta=10000.0),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-14B": _distill(_QWEN2_5_14B),
    "deepseek-ai/DeepSeek-R1-Distill-Qwen-32B": _distill(_QWEN2_5_32B),
    "deepseek-ai/DeepSeek-R1-Distill-Llama-8B": _distill(_LLAMA3_1_8B),
    "deepseek-ai/DeepSeek-R1-Distill-Llama-70B": _distill(_LLAMA3_1_70B),
    "google/gemma-2-2b": _GEMMA2_2B,
    "google/gemma-2-2b-it": _GEMMA2_2B,
    "google/gemma-2-9b": _GEMMA2_9B,
    "google/gemma-2-9b-it": _GEMMA2_9B,
    "google/gemma-2-27b": _GEMMA2_27B,
    "google/gemma-2-27b-it": _GEMMA2_27B,
    "google/gemma-3-1b-pt": _GEMMA3_1B,
    "google/gemma-3-1b-it": _GEMMA3_1B,
}

# The name without its org, case-folded -> repo id: `Qwen2.5-7B-Instruct`, `qwen/qwen2.5-7b-instruct`
# and `~/models/Qwen2.5-7B-Instruct` all find Qwen/Qwen2.5-7B-Instruct.
_BY_NAME = {repo.rsplit("/", 1)[-1].casefold(): repo for repo in MODEL_SHAPES}


def config_url(repo: str) -> str:
    """Where the numbers of MODEL_SHAPES[repo] were read."""
    return f"https://huggingface.co/{repo}/blob/main/config.json"


def known_shape(name: str) -> tuple[str, dict] | None:
    """(repo id, config fields) of the model `name` ends with (a hub id, with or without its org,
    or a path whose last part is the model's name); None when the table does not hold it."""
    last = PurePosixPath(name.strip().rstrip("/")).name.casefold()
    repo = _BY_NAME.get(last)
    return (repo, MODEL_SHAPES[repo]) if repo else None
