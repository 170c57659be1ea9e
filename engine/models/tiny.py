"""Build a tiny random-weight causal LM plus a local tokenizer, fully offline.

Tests and CPU smoke runs need a real HF checkpoint directory (config, weights,
tokenizer, chat template) that `AutoModelForCausalLM.from_pretrained` and
`AutoTokenizer.from_pretrained` accept, but must never touch the network. So the
model is built from a config with random weights, and the tokenizer is assembled
from the `tokenizers` library rather than downloaded.

Tokenizer design: a Qwen2-style byte-level BPE (same pre-tokenize regex, NFC
normaliser and ByteLevel decoder as transformers' Qwen2Tokenizer), trained here
with `tokenizers.BpeTrainer` on a small fixed in-memory corpus. Two reasons:

* transformers 5 ignores `tokenizer_class` in tokenizer_config.json for
  model_type "qwen2" and always rebuilds a Qwen2Tokenizer from the saved
  vocab/merges. Any other tokenizer design (WordLevel, custom pre-tokenizer)
  would silently change behaviour on reload; this one round-trips identically.
* Byte-level BPE covers every string (no unknown tokens), and training with a
  vocabulary cap of 512 keeps a random policy's chance of emitting a synthetic
  target (each a single token, see engine.data.synthetic) reasonably high.

The trainer is deterministic for a fixed corpus, so same settings give the same
vocabulary, ids and weights.

CLI: `python -m engine.models.tiny OUT_DIR [--arch qwen2|llama] [--seed N]`.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
from pathlib import Path
from typing import Any

from engine.data.synthetic import PROMPT_TEMPLATES, TARGET_WORDS

# Bump when the build recipe changes, so stale cached directories are rebuilt.
BUILDER_VERSION = 1
MARKER_FILE = "rlconf_tiny_model.json"
INIT_DEVICES = ("cpu", "cuda")  # where the random draw may run (cuda: the first visible GPU)
VOCAB_SIZE = 512  # cap, including the 256 byte tokens and the special tokens

# As in Qwen2, "<|endoftext|>" serves as pad and unk. It must exist in the vocab:
# Qwen2Tokenizer (used on reload, see above) otherwise appends it as a new token,
# making len(tokenizer) exceed the model's vocab_size.
PAD, BOS, IM_START, IM_END = "<|endoftext|>", "<|bos|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS: tuple[str, ...] = (PAD, BOS, IM_START, IM_END)

# Qwen-style ChatML template. The end-of-turn token doubles as EOS so generation
# stops at the end of the assistant turn, as with Qwen instruct models.
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

# Copied from transformers' Qwen2Tokenizer (not imported: its location moved across versions).
PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"""
    r"""\s*[\r\n]+|\s+(?!\S)|\s+"""
)

# Instruction wording used by the GSM8K / MATH prompts, and frequent word-problem
# vocabulary. Only an efficiency choice: byte-level BPE encodes anything.
INSTRUCTION_TEXT: tuple[str, ...] = (
    'Let\'s think step by step and output the final answer after "####".',
    "Please reason step by step, and put your final answer within \\boxed{}.",
    "#### \\boxed{ } \\frac{1}{2}",
)
COMMON_TEXT = (
    "the a an and of to in is it for on at with how many much what how if he she they his her "
    "their has have had each per total more than then so are was were will does do dollars days "
    "hours minutes times number half twice buy sells cost price left every week year old "
    "How What If The He She They"
)


def _training_corpus() -> list[str]:
    """Fixed corpus; repetition counts set merge priority (targets first, prose last)."""
    corpus: list[str] = []
    for word in TARGET_WORDS:
        # Bare form = the correct response right after "assistant\n"; the
        # space-prefixed form is how targets appear inside prompts.
        corpus += [word] * 200 + [f" {word}"] * 200
    for template in PROMPT_TEMPLATES:
        corpus += [template.format(w=w) for w in TARGET_WORDS] * 20
    corpus += [f"{role}\n" for role in ("user", "assistant", "system")] * 100
    corpus += list(INSTRUCTION_TEXT) * 20 + [COMMON_TEXT] * 5
    return corpus


def build_tokenizer(vocab_size: int | None = None) -> Any:
    """Return a `PreTrainedTokenizerFast`: byte-level BPE, chat template, pad/bos/eos set.

    `vocab_size`: filled up to that many ids with placeholder tokens `w0`, `w1`, ... (a random-weight model of a
    real vocabulary then writes text of as many tokens as it samples, which re-tokenizes to the same count: a
    reward model reading its decoded responses costs what it would on a real model's)."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    # Mirrors Qwen2Tokenizer.__init__ exactly, so a qwen2 reload behaves identically.
    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # all 256 bytes: nothing is unknown
        min_frequency=1,
        show_progress=False,
    )
    tok.train_from_iterator(_training_corpus(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,  # defined for completeness; like Qwen, never auto-prepended
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=PAD,  # byte-level BPE never needs it; set so reloads agree on it
        clean_up_tokenization_spaces=False,  # would corrupt "a ." style text on decode
        model_max_length=4096,
    )
    fast.chat_template = CHAT_TEMPLATE
    if vocab_size is not None and vocab_size > len(fast):
        # Each starts with "w" and the rest are digits: decoded back to back they re-tokenize unambiguously.
        fast.add_tokens([f"w{i}" for i in range(vocab_size - len(fast))])
    return fast


def _settings(arch: str, **kwargs: int) -> dict[str, Any]:
    """Marker content: every input that determines the output directory's bytes."""
    recipe = json.dumps([_training_corpus(), SPECIAL_TOKENS, CHAT_TEMPLATE, VOCAB_SIZE, PRETOKENIZE_REGEX])
    recipe_sha = hashlib.sha256(recipe.encode()).hexdigest()[:16]
    return {"builder_version": BUILDER_VERSION, "arch": arch, "tokenizer_sha": recipe_sha, **kwargs}


def _model_settings(*, arch: str, hidden_size: int, num_layers: int, num_heads: int, num_kv_heads: int,
                    intermediate_size: int, max_position_embeddings: int, seed: int, vocab_size: int | None,
                    tie_word_embeddings: bool, rope_theta: float | None, weights_dtype: str, full_vocabulary: bool,
                    init_device: str) -> dict[str, Any]:
    """build_tiny_model's marker: its arguments, the defaults left out (older markers stay valid)."""
    return _settings(
        arch, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads,
        num_kv_heads=num_kv_heads, intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings, seed=seed,
        **({} if vocab_size is None else {"vocab_size": vocab_size}),
        **({} if tie_word_embeddings else {"tie_word_embeddings": False}),
        **({} if rope_theta is None else {"rope_theta": rope_theta}),
        **({} if weights_dtype == "float32" else {"weights_dtype": weights_dtype}),
        **({"full_vocabulary": True} if full_vocabulary else {}),
        **({} if init_device == "cpu" else {"init_device": init_device}),
    )


def _is_complete(out: Path, settings: dict[str, Any]) -> bool:
    """True if `out` holds a finished build with identical settings (marker written last)."""
    marker = out / MARKER_FILE
    if not marker.is_file():
        return False
    try:
        stored = json.loads(marker.read_text())
    except (OSError, json.JSONDecodeError):
        return False
    required = ("config.json", "tokenizer.json", "tokenizer_config.json")
    has_weights = any(out.glob("*.safetensors")) or (out / "pytorch_model.bin").is_file()
    return stored == settings and has_weights and all((out / f).is_file() for f in required)


def _save(out: Path, model: Any, tokenizer: Any, settings: dict[str, Any]) -> Path:
    """Model and tokenizer into `out`, the marker last: a build cut short never looks complete."""
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER_FILE).unlink(missing_ok=True)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    (out / MARKER_FILE).write_text(json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return out


def build_tiny_model(
    out_dir: str | Path,
    arch: str = "qwen2",
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 128,
    max_position_embeddings: int = 512,
    seed: int = 0,
    vocab_size: int | None = None,
    tie_word_embeddings: bool = True,
    rope_theta: float | None = None,
    weights_dtype: str = "float32",
    full_vocabulary: bool = False,
    init_device: str = "cpu",
) -> Path:
    """Write a random-weight HF causal LM and its tokenizer to `out_dir`; return the path.

    Idempotent: if `out_dir` already holds a complete build with the same settings
    (checked via a marker json written last), nothing is rebuilt.

    Args:
        arch: "qwen2" (Qwen2ForCausalLM) or "llama" (LlamaForCausalLM).
        seed: torch seed for the weight init; same settings give identical weights.
        vocab_size: the model's vocabulary (None: exactly the tokenizer's). A larger one gives a real
            model's LM-head cost; ids the tokenizer lacks decode to nothing.
        weights_dtype: how the weights are saved ("bfloat16" halves a large model's files).
        full_vocabulary: the tokenizer covers all `vocab_size` ids (build_tokenizer's placeholders).
        init_device: where the random draw runs ("cpu" or "cuda"). The weights follow the same distribution
            either way, but the devices' generators draw different numbers, so the device is part of the
            marker: a directory holds the bytes of one device's draw. The same settings give the same bytes on
            the CPU; on a GPU only for the same GPU model and torch (CUDA's generator spreads the draw over
            the GPU's multiprocessors).
    """
    if arch not in ("qwen2", "llama"):
        raise ValueError(f"arch must be 'qwen2' or 'llama', got {arch!r}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise ValueError("hidden_size must divide by num_heads, and num_heads by num_kv_heads")
    if init_device not in INIT_DEVICES:
        raise ValueError(f"init_device must be one of {INIT_DEVICES}, got {init_device!r}")
    out = Path(out_dir)
    settings = _model_settings(
        arch=arch, hidden_size=hidden_size, num_layers=num_layers, num_heads=num_heads, num_kv_heads=num_kv_heads,
        intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings, seed=seed,
        vocab_size=vocab_size, tie_word_embeddings=tie_word_embeddings, rope_theta=rope_theta,
        weights_dtype=weights_dtype, full_vocabulary=full_vocabulary, init_device=init_device)
    if _is_complete(out, settings):
        return out

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    tokenizer = build_tokenizer(vocab_size if full_vocabulary else None)
    config_cls, model_cls = (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    extra = {} if rope_theta is None else {"rope_theta": rope_theta}
    config = config_cls(
        # Exact size by default: a random policy can never emit an id the tokenizer lacks.
        vocab_size=vocab_size or len(tokenizer),
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,  # True halves the parameter count of an already tiny model
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **extra,
    )
    # fork_rng: seed the init without disturbing the caller's global RNG stream.
    on_cuda = init_device == "cuda"
    with torch.random.fork_rng(devices=[torch.cuda.current_device()] if on_cuda else []), torch.device(init_device):
        torch.manual_seed(seed)
        model = model_cls(config).to(getattr(torch, weights_dtype))
    if on_cuda:
        model = model.to("cpu")  # written from host memory; the GPU's copy is freed with its process
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.bos_token_id = tokenizer.bos_token_id
    return _save(out, model, tokenizer, settings)


# tiny://<arch>-reward: a reward model whose weights are set by hand so that its score is a known
# function of the tokens: (nearly) the fraction of digit tokens ("0".."9") in the whole sequence.
REWARD_TOKENS = tuple(str(digit) for digit in range(10))
REWARD_SCALE = 100.0  # s below: the larger, the closer the score is to the fraction itself


def tiny_reward_score(input_ids: list[int], target_ids: set[int], scale: float = REWARD_SCALE) -> float:
    """The score `build_tiny_reward_model`'s model gives a sequence, in closed form.

    f = (target tokens) ÷ (tokens), over the prompt and the response (the model's attention averages
    over every real token before the last); the final RMSNorm makes the score f ÷ √(1 + (f / s)²).
    """
    fraction = sum(token in target_ids for token in input_ids) / len(input_ids)
    return fraction / (1.0 + (fraction / scale) ** 2) ** 0.5


def build_tiny_reward_model(out_dir: str | Path, arch: str = "qwen2", tokenizer: Any = None, **shape: int) -> Path:
    """Write a token-classification model (one label) of the tiny shape whose score is `tiny_reward_score`.

    `tokenizer`: the reward model's own (a `PreTrainedTokenizerFast` in which "0".."9" are tokens), for a
    reward model whose tokenizer differs from the policy's; None: the tiny policy's (`build_tokenizer`).
    `shape`: entries of TINY_REWARD_SHAPE to change (e.g. a head size vLLM's attention kernels take: the
    score does not depend on the shape).

    How the weights compute it (every other weight 0, norms 1; head dim d, hidden H):
    - embeddings: a target token is s·e₀, any other s·e₁ (the same norm, so the first RMSNorm maps
      every token to √H on its channel);
    - layer 0's attention: q and k are 0, so every position attends uniformly to its causal prefix;
      value channel 0 of the first key/value head reads channel 0 ÷ √H (1 for a target token, else 0),
      so its output is the prefix's target fraction f, and o_proj adds it to residual channel 2;
    - the MLPs and layer 1's attention add nothing; at the last token the final RMSNorm sees
      s·e₀|₁ + f·e₂ and the head reads channel 2 with weight s ÷ √H: f ÷ √(1 + (f / s)²).
    """
    own = {} if tokenizer is None else {"own_tokenizer_sha": hashlib.sha256(json.dumps(
        [sorted(tokenizer.get_vocab().items()), tokenizer.chat_template]).encode()).hexdigest()[:16]}
    unknown = set(shape) - set(TINY_REWARD_SHAPE)
    if unknown:
        raise ValueError(f"unknown shape keys {sorted(unknown)}; known: {sorted(TINY_REWARD_SHAPE)}")
    shape = {**TINY_REWARD_SHAPE, **shape}
    settings = _settings(arch, reward_tokens=list(REWARD_TOKENS), reward_scale=REWARD_SCALE, **shape, **own)
    out = Path(out_dir)
    if _is_complete(out, settings):
        return out

    import torch
    from transformers import LlamaConfig, LlamaForTokenClassification, Qwen2Config, Qwen2ForTokenClassification

    if arch not in ("qwen2", "llama"):
        raise ValueError(f"arch must be 'qwen2' or 'llama', got {arch!r}")
    tokenizer = build_tokenizer() if tokenizer is None else tokenizer
    config_cls, model_cls = ((Qwen2Config, Qwen2ForTokenClassification) if arch == "qwen2"
                             else (LlamaConfig, LlamaForTokenClassification))
    config = config_cls(vocab_size=len(tokenizer), hidden_size=shape["hidden_size"],
                        num_hidden_layers=shape["num_layers"], num_attention_heads=shape["num_heads"],
                        num_key_value_heads=shape["num_kv_heads"], intermediate_size=shape["intermediate_size"],
                        max_position_embeddings=shape["max_position_embeddings"], num_labels=1,
                        tie_word_embeddings=True, bos_token_id=tokenizer.bos_token_id,
                        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = model_cls(config)
    hidden, scale = config.hidden_size, REWARD_SCALE
    targets = [tokenizer.convert_tokens_to_ids(token) for token in REWARD_TOKENS]
    with torch.no_grad():
        for param in model.parameters():
            param.zero_()
        for name, param in model.named_parameters():
            if name.endswith("layernorm.weight") or name.endswith("norm.weight"):
                param.fill_(1.0)
        embed = model.model.embed_tokens.weight
        embed[:, 1] = scale
        embed[targets, 1] = 0.0
        embed[targets, 0] = scale
        attention = model.model.layers[0].self_attn
        attention.v_proj.weight[0, 0] = 1.0 / hidden ** 0.5  # key/value head 0, its channel 0
        attention.o_proj.weight[2, 0] = 1.0  # query head 0 (reads key/value head 0), its channel 0
        model.score.weight[0, 2] = scale / hidden ** 0.5
    return _save(out, model, tokenizer, settings)


TINY_REWARD_SHAPE = {"hidden_size": 64, "num_layers": 2, "num_heads": 4, "num_kv_heads": 2, "intermediate_size": 128,
                     "max_position_embeddings": 512}


def build_random_model(name: str, out_dir: str | Path, seed: int = 0, full_vocabulary: bool = False,
                       init_device: str | None = None) -> Path:
    """A random-weight model of a real model's shape (rlconf.modelinfo.RANDOM_TWINS names it), saved in bf16.
    `full_vocabulary`: a tokenizer for every id of the shape's vocabulary (build_tokenizer's placeholders).

    `init_device` None: where a visible GPU has room for the fp32 draw (gpu_for_draw), the draw runs there, in a
    process of its own, with a draw on the CPU as the fallback if that process fails; otherwise on the CPU.
    Drawing a 7B shape's 30 GB of fp32 weights took 116 s on a 16-vCPU GPU host's CPU (2026-11-28): device time
    spent on nothing. The process of its own keeps the caller (a launch's driver) without a CUDA context, which
    would hold GPU memory for the rest of the run. A directory already built by either device's draw is kept."""
    kwargs = random_model_kwargs(name, seed, full_vocabulary)
    if init_device is not None:
        return build_tiny_model(out_dir, **kwargs, init_device=init_device)
    out = Path(out_dir)
    if _built_by_either_draw(out, kwargs):
        return out
    from rlconf.modelinfo import RANDOM_PREFIX, model_info

    params = model_info(RANDOM_PREFIX + name).num_params or 0.0
    gpu = gpu_for_draw(params * 4 * 1.1 + 2 * 2**30)  # fp32 weights, a bf16 copy of the largest, the context
    if gpu is not None:
        try:
            return build_in_child(out, kwargs, "cuda", gpu=gpu)
        except RuntimeError as exc:
            if _built_by_either_draw(out, kwargs):  # it failed after writing (at CUDA's teardown, say)
                return out
            print(f"random://{name}: the draw on GPU {gpu} failed ({exc}); drawing on the CPU instead", flush=True)
    return build_tiny_model(out, **kwargs, init_device="cpu")


def random_model_kwargs(name: str, seed: int = 0, full_vocabulary: bool = False) -> dict[str, Any]:
    """build_tiny_model's arguments (but the device) for random://NAME: its twin's shape, bf16 weights."""
    from rlconf.modelinfo import RANDOM_PREFIX, RANDOM_TWINS, random_shape

    shape = random_shape(RANDOM_PREFIX + name)
    if shape is None:
        raise ValueError(f"random://{name}: no such shape; known: {', '.join(RANDOM_TWINS)}")
    return dict(
        arch=shape["model_type"], hidden_size=shape["hidden_size"], num_layers=shape["num_hidden_layers"],
        num_heads=shape["num_attention_heads"], num_kv_heads=shape["num_key_value_heads"],
        intermediate_size=shape["intermediate_size"], max_position_embeddings=shape["max_position_embeddings"],
        seed=seed, vocab_size=shape["vocab_size"], tie_word_embeddings=shape["tie_word_embeddings"],
        rope_theta=shape["rope_theta"], weights_dtype="bfloat16", full_vocabulary=full_vocabulary)


def _built_by_either_draw(out: Path, kwargs: dict[str, Any]) -> bool:
    return any(_is_complete(out, _model_settings(**kwargs, init_device=device)) for device in INIT_DEVICES)


def gpu_for_draw(need_bytes: float) -> str | None:
    """The visible GPU (its index, as CUDA_VISIBLE_DEVICES names it) with the most free memory, if that is at least
    `need_bytes`; None where there is none, nvidia-smi cannot say, or CUDA_VISIBLE_DEVICES names GPUs otherwise than
    by index. nvidia-smi, not torch: the caller stays without CUDA initialised, as a launch's driver does."""
    from rlconf.device import smi_query, visible_gpu_indices

    out = smi_query("index,memory.free")
    if out is None:
        return None
    try:
        free_mib = {int(index): float(free) for index, free in (line.split(",") for line in out.splitlines() if line)}
    except ValueError:  # a number nvidia-smi could not read ("[N/A]")
        return None
    indices = visible_gpu_indices(len(free_mib))
    if not indices or any(index not in free_mib for index in indices):
        return None
    best = max(indices, key=lambda index: free_mib[index])
    return str(best) if free_mib[best] * 2**20 >= need_bytes else None


_CHILD = ("import json, sys; from engine.models.tiny import build_tiny_model; a = json.loads(sys.argv[1]); "
          "build_tiny_model(a['out'], **a['kwargs'], init_device=a['device'])")


def build_in_child(out_dir: str | Path, kwargs: dict[str, Any], init_device: str, gpu: str | None = None) -> Path:
    """build_tiny_model(out_dir, **kwargs, init_device=...) in a Python process of its own, on `gpu` (an index for
    its CUDA_VISIBLE_DEVICES) when given; RuntimeError with its last words if it fails. Its own session: a
    terminal's Ctrl-C reaches the caller only, which decides (a launch lets a stage finish); an exception in the
    caller while it waits (a second Ctrl-C) kills it."""
    import subprocess
    import sys

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path for path in sys.path if path))
    if gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = gpu
    arguments = json.dumps({"out": str(out_dir), "kwargs": kwargs, "device": init_device})
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, arguments], env=env, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)
    try:
        _, err = proc.communicate()
    except BaseException:
        proc.kill()
        proc.wait()
        raise
    if proc.returncode != 0:
        lines = [line for line in err.splitlines() if line.strip()]
        raise RuntimeError(lines[-1][:2000] if lines else f"exit code {proc.returncode}")
    return Path(out_dir)


def main(argv: list[str] | None = None) -> int:
    """CLI entry point: build (or reuse) a tiny model directory and print its path."""
    parser = argparse.ArgumentParser(description="Build a tiny random-weight HF causal LM offline.")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--arch", choices=("qwen2", "llama"), default="qwen2")
    parser.add_argument("--hidden-size", type=int, default=64)
    parser.add_argument("--num-layers", type=int, default=2)
    parser.add_argument("--num-heads", type=int, default=4)
    parser.add_argument("--num-kv-heads", type=int, default=2)
    parser.add_argument("--intermediate-size", type=int, default=128)
    parser.add_argument("--max-position-embeddings", type=int, default=512)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path = build_tiny_model(
        args.out_dir, arch=args.arch, hidden_size=args.hidden_size, num_layers=args.num_layers,
        num_heads=args.num_heads, num_kv_heads=args.num_kv_heads,
        intermediate_size=args.intermediate_size,
        max_position_embeddings=args.max_position_embeddings, seed=args.seed,
    )
    print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
