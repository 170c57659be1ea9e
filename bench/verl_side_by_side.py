"""rlconf side by side with verl 0.9.1 itself: the same model directory, prompts, reward and dotted
overrides given to `python -m verl.trainer.main_ppo` and to `rlconf launch`, GRPO, on one GPU (w1, w2) or two (w3, w4).

    python bench/verl_side_by_side.py [--workloads w1,w2] [--sides rlconf,verl,rlconf_best] [--steps 5]
        [--verl-site /tmp/verlsite] [--verl-ready FILE] [--budget-s 1300] [--run-timeout-s 600] [--out DIR]
        [key=value ...]   # extra overrides for every side, e.g. actor_rollout_ref.model.use_fused_kernels=true
    python bench/verl_side_by_side.py --prepare-only --workloads w4   # build the model directories, then exit
    python bench/verl_side_by_side.py --check [--workloads w3,w4]     # CPU: rlconf's plan fits an H100; verl composes
    python bench/verl_side_by_side.py --print-overrides [--workloads w1]
    python bench/verl_side_by_side.py --report results.json   # the table again, from a results file

(--check's verl part runs verl's validate_config where verl imports: the carried .carry/verl folder is built for
the device's Python 3.12; on a 3.11 machine, cp311 wheels of tensordict 0.10.0, orjson 3.13.0 and xxhash 4.1.0
copied over it, plus pandas, python-dateutil, tzdata and dill, let it import. Otherwise it composes and says so.)

Every workload (bench/grpo_vs_trl.py's, with verl's layout): a random-weight model of a real model's shape
(rlconf's `random://NAME` with a tokenizer covering all of its vocabulary, built once and passed to both as
a directory: prepare_model says why), the synthetic echo task as
verl-schema parquet (`rlconf data synthetic`), bench/verl_reward.py as the custom reward, 8 samples a
prompt, 512 sampled tokens each (`ignore_eos`), one optimizer step a GRPO step (ppo_mini_batch_size = the
prompts a step), dynamic batch size with one token budget a GPU for the update and the log-prob passes
(verl's log-prob budgets follow the actor's; so do rlconf's), vLLM on the training GPUs (colocated, sleeping
while the actor trains). The workloads (WORKLOADS below):

| workload | model | GPUs (FSDP) | rollout TP | prompts a step | token budget a GPU | more |
|---|---|---|---|---|---|---|
| w1 | random://Qwen2.5-0.5B | 1 | 1 | 8 | 33,792 (64 sequences of 528) | |
| w2 | random://Qwen2.5-0.5B | 1 | 1 | 32 | 33,792 | |
| w3 | random://Qwen2.5-1.5B | 2 | 1 (2 replicas) | 16 | 16,896 (32 sequences) | |
| w4 | random://Qwen2.5-7B | 2 | 2 (1 replica) | 16 | 4,224 (8 sequences) | actor param + optimizer offload |

w1's and w2's overrides are the ones docs/benchmarks.md published (2026-11-26); a test holds them to it.
- w3 is w1 weak-scaled over FSDP on two GPUs: 8 prompts × 8 samples a GPU (the issue's "2 GPUs ≥ 1.9× one
  GPU" is per GPU), two vLLM replicas. Its budget is half of w1's, for verl: verl's update allocated 72.5 GiB
  on w1, ≈ 1.97 MiB a token of budget beyond its 7.4 GiB of fp32 params, grads and Adam moments (16 B × 494M);
  at w1's budget the 1.5B model (11.5 GiB of those a GPU, larger layers) comes to ≈ 79.4 GiB before the ≈ 2.3
  GiB its sleeping vLLM server held on w1 (device 79.0 − actor reserved 76.7): over the card. At 16,896, ≈ 45.
- w4 is the size the presets are for, 7B on two GPUs as verl's examples/tuning/7b/qwen2-7b_grpo_2_h800_fsdp_vllm.sh
  runs it: actor param and optimizer offload (without them rlconf estimates 82 GiB a GPU while vLLM runs), rollout
  TP 2 (≈ 15 GB of bf16 weights, one replica). gpu_memory_utilization stays 0.5 (that script's 0.6 buys KV cache
  this batch does not use: 128 × 528 tokens are ≈ 1.8 GiB a GPU at TP 2). 16 prompts, the per-GPU batch of w1 and
  w3: the token budget, not the batch, sets the memory, and fewer prompts would only spread the offload's
  transfers (the shards on and off the GPU every step) over fewer tokens. The budget is set by verl: its train
  mode loads the offloaded Adam moments for the whole update (verl/workers/engine/base.py, BaseEngineCtx), so its
  states are 56.7 GiB a GPU (16 B × 7.62B ÷ 2); with w1's ≈ 1.88 MiB a token for the vocabulary-wide head and
  7B's layers on top, 8 sequences a micro batch come to ≈ 66 GiB (+ ≈ 2.3), 16 (that script's
  ppo_micro_batch_size_per_gpu) to ≈ 75.5 (+ ≈ 2.3): under 2 GiB to spare. rlconf holds Adam's moments on the
  GPU for the optimizer step only. `--check` prints rlconf's estimate per phase for every workload and fails
  where one is over an H100's 79.6 GiB.
- random://Qwen2.5-7B is drawn in fp32 and written as ≈ 15 GB of bf16 safetensors (engine/models/tiny.py,
  build_random_model: on a GPU machine the draw runs on the GPU, in a child process). Drawn on a CPU,
  random://Qwen2.5-1.5B took 88 s on a loaded 2-core VM and 44.7 s on a 32-vCPU H200 host, the 7B 116 s on a
  16-vCPU one; hence --prepare-only, ahead of the runs. Loading it is slow on both sides too (each reads the
  15 GB and keeps fp32 master weights), so w4 takes most of a GPU session.

Sides:
- verl: `python -m verl.trainer.main_ppo <SHARED>` (its v1 sync trainer, vLLM in server mode, FSDP engine
  workers), run from a directory without rlconf's tree on the path (verl's site folder first); its process
  group is killed once its last step is on its console (what follows is its shutdown);
- rlconf: `python -m rlconf launch <empty plan> <SHARED> --run-dir DIR` (an empty plan file: every
  setting comes from the overrides and the schema's defaults, which are verl's but for the ones the
  overrides set here);
- rlconf_mp: the same with vLLM in processes of its own (RLCONF_MP: `distributed_executor_backend: mp`, the
  layout verl's server runs vLLM in; the weights reach it by CUDA IPC);
- rlconf_best: the same plus rlconf's fastest knobs (RLCONF_BEST: packing, compiled layers, vLLM async
  scheduling; the loss head is use_torch_compile's Triton kernels on both rlconf rows). Packed against verl's
  padded path is not like with like: verl's packed path (`use_remove_padding=true`) needs flash-attn 2, which
  has no wheel for the device image's torch 2.11, so this row stands apart and is labelled.

SHARED is one list (shared_overrides below): verl's own performance-tuning guide's knobs within the
workload (dynamic batch size with one token budget for the update and the log-prob passes, the
vLLM memory fraction in the guide's range, gradient checkpointing), padded attention through SDPA for both,
and the workload's GPUs, tensor parallel size and offload. Every key in it is read by both: w4's
`actor.fsdp_config.param_offload` / `optimizer_offload` are verl's keys, which rlconf's engine honours
(engine/workers/fsdp/offload.py). Only one side gets: rlconf, `--run-dir` and the empty plan file (and, in
--check only, `estimate.gpu_memory_gib=79.6`: a launch measures its GPU); verl, its working directory. Both
run with CUDA_VISIBLE_DEVICES = the workload's GPUs (the environment, not the plan): Ray, on either side,
takes the GPUs it sees, so nvidia-smi watches the GPUs the run is on, even for w1 on a two-GPU host.
Trailing `key=value` arguments join SHARED for every side. The one to give next: verl's
`actor_rollout_ref.model.use_fused_kernels=true`. Without flash-attn (no wheel here) verl 0.9.1's engine worker
computes the update's log-probs with `logprobs_from_logits_v2`, a Python loop of one log-softmax per row of the
[tokens, vocabulary] logits (verl/utils/torch_functional.py), which is where its 1.4-1.7% MFU of 2026-11-26/27
most likely went; the fused kernels compute them from hidden states in chunks. rlconf implements the key too.

Per run: step time (median of steps 2..N), completion tokens/s (sampled tokens ÷ step), each side's own
stage timings (verl's `timing_s/*`, rlconf's `timing/*`), the device's peak used memory (nvidia-smi on each
of the workload's GPUs, every 0.25 s over the whole run, both sides alike; the table shows the largest,
results.json each GPU's), each side's own peak metrics, rlconf's memory estimate ÷ its measured peaks, and
the time to the first step: from the command's start to the first step's metrics line on its console. Each
run's console goes to <out>/<workload>_<side>.log; results.json is rewritten after every run (a later one
cut off loses only itself). With --budget-s no run starts with less than MIN_RUN_S of it left and every run
is stopped at it (its steps so far are kept).

On the device (nvidia-h100-x2 for w3 and w4; shared/device/README.md §1-2 and §4 build .carry/c0-c3,
.carry/verl and .carry/verl2). A machine is held 30 minutes at most, so one session runs one of w3, w4:
the bench goes on in the background (setsid) across calls made back to back, from a copy of the tree in
/tmp/repo (each call replaces the working tree), writing to /tmp/sbs_out (each call empties $OUT). w3:

| call | carry | command |
|---|---|---|
| 1 | [".carry/c0"] | `mkdir -p /tmp/parts && cp .carry/c0/* /tmp/parts/` |
| 2 | [".carry/c1"] | `cp .carry/c1/* /tmp/parts/` |
| 3 | [".carry/c2"] | `cp .carry/c2/* /tmp/parts/` |
| 4 | [".carry/c3", ".carry/verl"] | UNPACK `&&` COPY `&& mkdir -p /tmp/sbs_out && cd /tmp/repo &&` START |
| 5 | [".carry/verl2"] | `cp -r .carry/verl2/* /tmp/verlsite/ && touch /tmp/verl2.ready;` WATCH |
| 6.. | [] | WATCH, until the console ends with the table (the files so far come back with every call) |

    WATCH = sleep 540; tail -25 /tmp/sbs_out/console.txt; cp -r /tmp/sbs_out/. $OUT/
    COPY = rm -rf /tmp/repo && cp -r . /tmp/repo && rm -rf /tmp/repo/.carry
    UNPACK = cp .carry/c3/* /tmp/parts/ && cat /tmp/parts/* > /tmp/b.tar.xz && mkdir -p /tmp/site /tmp/verlsite \
        && tar -xJf /tmp/b.tar.xz -C /tmp/site && cp -r .carry/verl/* /tmp/verlsite/
    START = export PYTHONPATH=/tmp/repo:/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 RAY_AUTH_MODE=disabled \
        PYTHONUNBUFFERED=1 && (setsid nohup python3 bench/verl_side_by_side.py --workloads w3 \
        --sides rlconf,verl,rlconf_best --steps 5 --verl-site /tmp/verlsite --verl-ready /tmp/verl2.ready \
        --out /tmp/sbs_out --budget-s 1300 --run-timeout-s 600 > /tmp/sbs_out/console.txt 2>&1 < /dev/null &); \
        sleep 20; tail -5 /tmp/sbs_out/console.txt

w4: the 7B model is built first, in the background from call 1 (torch and transformers are the image's),
while the bundle is carried; call 4 waits for it before it starts the bench:

| call | carry | command |
|---|---|---|
| 1 | [".carry/c0"] | `mkdir -p /tmp/parts && cp .carry/c0/* /tmp/parts/ &&` COPY `&& cd /tmp/repo &&` PREPARE |
| 2, 3 | [".carry/c1"], [".carry/c2"] | as for w3, then `; cat /tmp/prep.txt` |
| 4 | [".carry/c3", ".carry/verl"] | UNPACK `&& while [ ! -f /tmp/prep.done ]; do sleep 5; done; cat /tmp/prep.txt; mkdir -p /tmp/sbs_out && cd /tmp/repo &&` START with `--workloads w4 --sides rlconf,verl --steps 4 --run-timeout-s 900` |
| 5.. | | as for w3 |

    PREPARE = (PYTHONPATH=/tmp/repo setsid nohup sh -c 'python3 bench/verl_side_by_side.py --prepare-only \
        --workloads w4; echo rc=$?; touch /tmp/prep.done' > /tmp/prep.txt 2>&1 < /dev/null &); sleep 5; cat /tmp/prep.txt

(--steps 4 for w4: three steady steps. On two H200s, 2026-11-28, rlconf's first step came at 200 s and its steps
took 12 s, verl's at 459 s and 16.6 s: about 13 minutes for both sides. rlconf_best can follow in another session.)
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "bench"))

from first_step import cache_sizes  # noqa: E402  (the caches a run finds, as first_step measures them)
from watched_launch import kill_group, steady_records  # noqa: E402

REWARD_FILE = Path(__file__).resolve().parent / "verl_reward.py"

SAMPLES, RESPONSE_TOKENS, PROMPT_TOKENS = 8, 512, 16  # synthetic prompts are 10-16 tokens with this tokenizer
SEQUENCE_TOKENS = PROMPT_TOKENS + RESPONSE_TOKENS  # every sequence, padded (and with ignore_eos, every response)
MODEL = "random://Qwen2.5-0.5B"
GPU_MEMORY_UTILIZATION = 0.5  # verl's default; its guide: "0.5 - 0.7 would be a good choice"
# One token budget for the update and the forward-only passes (verl's log-prob budgets follow the
# actor's): a whole w1 mini batch (64 × (16 + 512)) in one micro batch, as the guide's "increase it".
TOKEN_BUDGET = 64 * SEQUENCE_TOKENS
H100_GIB = 79.6  # one H100 80GB as torch and rlconf count it (nvidia-smi: 81,559 MiB): what --check fits the plans to
OFFLOAD = ("actor_rollout_ref.actor.fsdp_config.param_offload=true",
           "actor_rollout_ref.actor.fsdp_config.optimizer_offload=true")


@dataclass(frozen=True)
class Workload:
    """One workload's plan. Every field becomes a shared override: both sides get all of it."""

    prompts: int  # a step: data.train_batch_size = actor.ppo_mini_batch_size (one optimizer step a GRPO step)
    model: str = MODEL  # a random:// twin, built once into a directory that both sides get
    gpus: int = 1  # trainer.n_gpus_per_node (one node); FSDP over all of them, the rollout on the same GPUs
    rollout_tp: int = 1  # actor_rollout_ref.rollout.tensor_model_parallel_size
    token_budget: int = TOKEN_BUDGET  # actor.ppo_max_token_len_per_gpu (the log-prob passes follow it on both)
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    extra: tuple[str, ...] = ()  # more shared overrides, in verl's spelling

    @property
    def gpu_ids(self) -> str:
        """The GPUs it runs on and nvidia-smi watches: "0", or "0,1"."""
        return ",".join(str(i) for i in range(self.gpus))


WORKLOADS = {
    "w1": Workload(8),
    "w2": Workload(32),
    # w3 and w4: why these batches, budgets and knobs is in the module docstring
    "w3": Workload(16, "random://Qwen2.5-1.5B", gpus=2, token_budget=32 * SEQUENCE_TOKENS),
    "w4": Workload(16, "random://Qwen2.5-7B", gpus=2, rollout_tp=2, token_budget=8 * SEQUENCE_TOKENS, extra=OFFLOAD),
}
RLCONF_BEST = [
    "actor_rollout_ref.model.use_remove_padding=true",  # rlconf's varlen path (torch's flash kernel)
    "actor_rollout_ref.model.compile_layers=true",
    "actor_rollout_ref.rollout.engine_kwargs.vllm.async_scheduling=true",
]  # chunked entropy is moot beside the loss head's Triton kernels (use_torch_compile on CUDA, RL529)
# vLLM as verl runs it: its engine core and model runner in processes of their own beside the worker (verl 0.9.1
# starts its server with `--distributed_executor_backend mp`); the same plan otherwise.
RLCONF_MP = ["actor_rollout_ref.rollout.engine_kwargs.vllm.distributed_executor_backend=mp"]
SIDE_ADDS = {"rlconf_best": RLCONF_BEST, "rlconf_mp": RLCONF_MP}
SIDES = ("rlconf", "verl", *SIDE_ADDS)
VERL_STEP = re.compile(r"step:(\d+) - (.*)$")
NUMPY_SCALAR = re.compile(r"np\.\w+\((.*)\)")  # np.float64(0.5): how verl prints its actor metrics
# verl's entry points: (module, config folder inside the verl package, config name). The one-step off-policy
# recipe's config finds verl's ppo_trainer through `hydra.searchpath: file://verl/trainer/config`, a path
# relative to the working directory (verl's CI runs from its repository root): verl_workdir provides it.
VERL_MAIN = ("verl.trainer.main_ppo", "trainer/config", "ppo_trainer")
RLCONF_STEP = re.compile(r"(?:^|\s)step\s+(\d+)/\d+")


def shared_overrides(model_dir: str, data_dir: str, workload: Workload, steps: int, name: str,
                     extra: list[str] = ()) -> list[str]:
    """The dotted overrides both commands get, in verl's spelling (w1's and w2's as published, in that order), then
    `extra`: the command line's own, given to every side alike, last so they win."""
    arr = "actor_rollout_ref"
    prompts = workload.prompts
    return [
        f"data.train_files={data_dir}/train.parquet", f"data.val_files={data_dir}/val.parquet",
        f"data.train_batch_size={prompts}", f"data.max_prompt_length={PROMPT_TOKENS}",
        f"data.max_response_length={RESPONSE_TOKENS}",
        f"{arr}.model.path={model_dir}", f"{arr}.model.enable_gradient_checkpointing=true",
        f"{arr}.model.use_remove_padding=false",  # padded: verl's packed path needs flash-attn 2 (no wheel here)
        f"+{arr}.model.override_config.attn_implementation=sdpa",  # verl's default is flash_attention_2
        f"{arr}.actor.ppo_mini_batch_size={prompts}",  # one optimizer step a GRPO step
        f"{arr}.actor.use_dynamic_bsz=true", f"{arr}.actor.ppo_max_token_len_per_gpu={workload.token_budget}",
        f"{arr}.actor.use_kl_loss=false", f"{arr}.actor.entropy_coeff=0", f"{arr}.actor.optim.lr=1e-6",
        f"{arr}.rollout.name=vllm", f"{arr}.rollout.n={SAMPLES}",
        f"{arr}.rollout.tensor_model_parallel_size={workload.rollout_tp}",
        f"{arr}.rollout.gpu_memory_utilization={workload.gpu_memory_utilization}", f"{arr}.rollout.enforce_eager=false",
        f"{arr}.rollout.ignore_eos=true", f"{arr}.rollout.free_cache_engine=true",
        "algorithm.adv_estimator=grpo", "algorithm.use_kl_in_reward=false",
        f"reward.custom_reward_function.path={REWARD_FILE}", "reward.custom_reward_function.name=compute_score",
        "trainer.device=cuda", "trainer.nnodes=1", f"trainer.n_gpus_per_node={workload.gpus}",
        f"trainer.total_training_steps={steps}", "trainer.save_freq=-1", "trainer.test_freq=-1",
        "trainer.val_before_train=false", "trainer.logger=[console]",
        "trainer.project_name=verl_side_by_side", f"trainer.experiment_name={name}",
        *workload.extra,
        *extra,
    ]


def side_overrides(side: str, shared: list[str]) -> list[str]:
    return shared + SIDE_ADDS.get(side, [])


# --- preparing the shared inputs -----------------------------------------------------------------


def prepare_model(model: str) -> str:
    """`model`'s directory: for random://NAME, rlconf's random twin of that shape with a tokenizer that covers every
    id of its vocabulary, built once into rlconf's cache (a marker file says it is complete), bf16 weights; any other
    value is a directory already. Needs torch and transformers only. random://Qwen2.5-7B is drawn in fp32 (≈ 30 GB,
    on the GPU where there is one) and written as ≈ 15 GB of bf16 safetensors: --prepare-only builds it ahead."""
    from engine.models import tiny
    from engine.models.loading import RANDOM_SCHEME, cache_root, resolve_model_path

    if not model.startswith(RANDOM_SCHEME):
        return str(resolve_model_path(model))
    # Why every id: verl's rollout sets the logits of ids at or above len(tokenizer) to -inf (its vLLM patch,
    # verl/workers/rollout/vllm_rollout/utils.py), its trainer's softmax does not. With the 509-token tokenizer of
    # rlconf's plain random twins verl sampled 509 of 151,936 ids and scored them against the full softmax: its
    # ppo_kl was log(151936 / 509) = 5.70 nats a token in every step (2026-11-27). Placeholder tokens for every id
    # give both sides the same distribution to sample and train (the tokenizer loads in ~9 s on a slow CPU).
    name = model[len(RANDOM_SCHEME):]
    return str(tiny.build_random_model(name, cache_root() / f"random-{name}-full-vocabulary", full_vocabulary=True))


def prepare(work: Path, model: str = MODEL) -> tuple[str, str]:
    """The model directory (prepare_model) and the parquet files, for both sides."""
    from engine.data.synthetic import write_synthetic_splits

    model_dir = prepare_model(model)
    data_dir = work / "data"
    if not (data_dir / "train.parquet").is_file():
        # The same rows `rlconf data synthetic DIR` writes (its default sizes).
        write_synthetic_splits(data_dir, 2048, 64, 0)
    return model_dir, str(data_dir)


# --- one run -------------------------------------------------------------------------------------


class GpuSampler:
    """nvidia-smi's used memory of the GPUs `gpus` ("0" or "0,1"), sampled in the background; peaks in GiB."""

    def __init__(self, period_ms: int = 250, gpus: str = "0") -> None:
        self.peaks_mib: dict[int, float] = {}
        self.proc = None
        if shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits",
                                          "-i", gpus, f"-lms={period_ms}"], stdout=subprocess.PIPE, text=True)
            self.thread = threading.Thread(target=self._read, daemon=True)
            self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            index, _, used = line.partition(",")
            try:
                gpu, mib = int(index), float(used)
            except ValueError:
                continue
            self.peaks_mib[gpu] = max(self.peaks_mib.get(gpu, 0.0), mib)

    def stop(self) -> float | None:
        """The largest peak of any sampled GPU, in GiB (`per_gpu_gib` keeps each)."""
        if self.proc is None:
            return None
        self.proc.terminate()
        self.proc.wait()
        return max(self.peaks_mib.values(), default=0.0) / 1024

    def per_gpu_gib(self) -> dict[int, float]:
        return {gpu: mib / 1024 for gpu, mib in sorted(self.peaks_mib.items())}


def gpu_used_gib(gpus: str = "0") -> float:
    """The most memory any of `gpus` has in use now, in GiB."""
    text = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "-i", gpus],
                          capture_output=True, text=True).stdout
    return max((float(line) for line in text.split() if line.strip()), default=0.0) / 1024


def wait_gpu_free(limit_gib: float = 2.0, timeout: float = 60.0, gpus: str = "0") -> float | None:
    """Wait until each of `gpus` uses under `limit_gib` (the last run's processes gone); the most one uses."""
    if not shutil.which("nvidia-smi"):
        return None
    deadline = time.perf_counter() + timeout
    while True:
        used = gpu_used_gib(gpus)
        if used < limit_gib or time.perf_counter() > deadline:
            return used
        time.sleep(1)


def wait_for(path: Path, timeout: float) -> bool:
    deadline = time.perf_counter() + timeout
    while not path.exists() and not STOP.is_set():
        if time.perf_counter() > deadline:
            return False
        time.sleep(1)
    return True


def parse_verl_line(text: str) -> tuple[int, dict[str, float]] | None:
    """verl's console logger line `step:N - key:value - ...` (Ray's prefix before it), numbers only. verl prints
    the actor's metrics as NumPy reprs (`actor/ppo_kl:np.float64(5.69)`, `num_turns/min:np.int32(2)`): unwrapped."""
    match = VERL_STEP.search(text)
    if not match:
        return None
    values: dict[str, float] = {}
    for part in match.group(2).split(" - "):
        key, sep, value = part.rpartition(":")
        if not sep:
            continue
        numpy_repr = NUMPY_SCALAR.fullmatch(value.strip())
        try:
            values[key.strip()] = float(numpy_repr.group(1) if numpy_repr else value)
        except ValueError:
            pass
    return int(match.group(1)), values


def verl_env(verl_site: str) -> dict[str, str]:
    """The environment verl runs in: verl's site folder first on the path, rlconf's tree off it."""
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(":") if p and Path(p).resolve() != ROOT]
    return dict(os.environ, PYTHONPATH=":".join([verl_site, *rest]))


def verl_command(entry: tuple[str, str, str], overrides: list[str]) -> list[str]:
    return [sys.executable, "-m", entry[0], *overrides]


def verl_workdir(parent: Path, verl_site: str) -> Path:
    """An otherwise empty working directory for verl (python -m puts it first on the path: no rlconf tree, no trl/
    there) holding verl/trainer/config, where the one-step recipe's relative `hydra.searchpath` looks for ppo_trainer.
    The folder has no __init__.py, so `import verl` still finds the package in `verl_site`."""
    cwd = parent / "cwd"
    (cwd / "verl" / "trainer").mkdir(parents=True)
    (cwd / "verl" / "trainer" / "config").symlink_to(Path(verl_site).resolve() / "verl" / "trainer" / "config")
    return cwd


# SIGTERM (an outer `timeout`, a device call's end): set once, it kills the run going on (its process group) and
# no run starts after it; the runs measured so far, that one's steps included, go into results.json and the
# script exits 143. The handler only sets the flag and kills: whatever the main thread was doing finishes.
STOP = threading.Event()
_RUNNING: set[int] = set()  # the process group of the run going on (its leader's pid)


def stop_on_sigterm() -> None:
    def handler(signum, frame):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # one is enough: the way out must not be cut short again
        STOP.set()
        for pid in list(_RUNNING):
            kill_group(pid)
    signal.signal(signal.SIGTERM, handler)


def run_side(side: str, overrides: list[str], out: Path, label: str, timeout: float, verl_site: str,
             entry: tuple[str, str, str] = VERL_MAIN, gpus: str = "0", stop_after_steps: int | None = None,
             wait_free: bool = True, deadline: float | None = None) -> dict:
    """One run. verl's: `entry`'s module; killed (its whole process group) once `stop_after_steps` steps are on its
    console, when given, rather than waiting for its shutdown. `wait_free`: then wait (up to 60 s, and not past
    `deadline`, a time.perf_counter() value) for the GPUs to empty, for the run after it; the run itself is
    stopped at `deadline` too. A SIGTERM (STOP) kills it: what it measured comes back, marked `interrupted`, and
    no wait follows."""
    log_path = out / f"{label}.log"
    with tempfile.TemporaryDirectory(prefix=f"sbs_{label}_") as tmp:
        run_dir = Path(tmp) / "run"
        env = dict(os.environ, PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0")
        if side == "verl":
            cwd = verl_workdir(Path(tmp), verl_site)
            env = dict(verl_env(verl_site), PYTHONUNBUFFERED="1", RAY_DEDUP_LOGS="0")
            command = verl_command(entry, overrides)
        else:
            cwd = ROOT
            plan = Path(tmp) / "plan.yaml"
            plan.write_text("# every setting comes from the command's overrides\n{}\n")
            command = [sys.executable, "-m", "rlconf", "launch", str(plan), *overrides, "--run-dir", str(run_dir)]
        # The GPUs nvidia-smi watches are the ones the run sees: Ray (both sides) takes its GPUs from what is
        # visible, so a one-GPU workload on a two-GPU host cannot land on a GPU the sampler does not read.
        env["CUDA_VISIBLE_DEVICES"] = gpus
        caches = cache_sizes()
        print(f"--- {label}: {' '.join(command[1:])}", flush=True)
        sampler = GpuSampler(gpus=gpus)
        first_step_s = None
        stopped = False
        verl_steps: dict[int, dict[str, float]] = {}
        if deadline is not None:  # counted from here: the config composed and the caches measured come first
            timeout = min(timeout, max(deadline - time.perf_counter(), 0.0))
        started = time.perf_counter()
        # Line-buffered: a script killed mid-run must not lose the log's last lines (its last steps).
        with open(log_path, "w", buffering=1) as log:
            proc = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True, errors="replace", start_new_session=True)
            _RUNNING.add(proc.pid)
            if STOP.is_set():  # a SIGTERM between the start and the line above
                kill_group(proc.pid)
            watchdog = threading.Timer(timeout, kill_group, (proc.pid,))
            watchdog.start()
            try:
                for line in proc.stdout:
                    now = time.perf_counter() - started
                    log.write(f"[{now:8.2f}] {line}")
                    if side == "verl":
                        parsed = parse_verl_line(line.rstrip("\n"))
                        if parsed:
                            verl_steps[parsed[0]] = parsed[1]
                            if first_step_s is None:
                                first_step_s = now
                            print(f"  [{now:7.1f}s] verl step {parsed[0]}: step {parsed[1].get('timing_s/step', 0):.2f}s",
                                  flush=True)
                            if stop_after_steps and len(verl_steps) >= stop_after_steps and not stopped:
                                stopped = True  # every step measured: what follows is verl's shutdown
                                kill_group(proc.pid)
                    elif RLCONF_STEP.search(line):
                        if first_step_s is None:
                            first_step_s = now
                        print(f"  [{now:7.1f}s] {line.strip()[:160]}", flush=True)
                proc.wait()
            finally:
                timed_out = not watchdog.is_alive() and proc.returncode is not None and proc.returncode < 0
                watchdog.cancel()
                kill_group(proc.pid)  # Ray's and vLLM's processes of this run, if any stayed
                _RUNNING.discard(proc.pid)
                proc.wait()
        interrupted = STOP.is_set() and not stopped and proc.returncode != 0
        if interrupted:
            print(f"  [{time.perf_counter() - started:7.1f}s] {label} stopped by SIGTERM: keeping its steps so far",
                  flush=True)
        wall = time.perf_counter() - started
        device_peak = sampler.stop()
        result = {"side": side, "label": label, "command": command[1:], "overrides": overrides, "exit": proc.returncode,
                  "timed_out": timed_out, "stopped_after_last_step": stopped, "interrupted": interrupted, "wall_s": wall,
                  "time_to_first_step_s": first_step_s, "device_peak_used_gib": device_peak,
                  "device_peak_used_gib_per_gpu": sampler.per_gpu_gib() if device_peak is not None else None,
                  "cache_bytes_before": caches, "log": log_path.name}
        if side == "verl":
            steps = [verl_steps[k] for k in sorted(verl_steps)]
        else:
            metrics_file = run_dir / "metrics.jsonl"
            steps = [json.loads(line) for line in metrics_file.read_text().splitlines()] if metrics_file.is_file() else []
            resolved = run_dir / "plan.resolved.json"
            if resolved.is_file():
                shutil.copy(resolved, out / f"{label}.plan.resolved.json")
                result["estimate_gib"] = {m["phase"]: m["total_gib"] for m in json.loads(resolved.read_text())["memory"]}
            error_log = run_dir / "error.log"
            if error_log.is_file():
                result["error_log"] = error_log.read_text()[-3000:]
    result["steps"] = steps
    wait_s = 60.0 if deadline is None else min(60.0, max(deadline - time.perf_counter(), 0.0))
    result["gpu_used_gib_after"] = wait_gpu_free(timeout=wait_s, gpus=gpus) if wait_free and not interrupted else None
    if (proc.returncode != 0 and not stopped) or not steps:
        try:
            result["log_tail"] = log_path.read_text(errors="replace")[-4000:]
        except OSError as exc:  # the log was moved or removed under the run
            result["log_tail"] = f"(log not readable: {exc})"
    return result


def steady_medians(steps: list[dict]) -> tuple[list[dict], dict[str, float]]:
    """The steady steps (2..N: watched_launch's steady_records; step 1 alone if it is all there is) and the median
    of every number each of them has."""
    warm = steady_records(steps)
    keys = {k for s in warm for k in s if isinstance(s[k], (int, float))}
    return warm, {k: statistics.median(s[k] for s in warm) for k in sorted(keys) if all(k in s for s in warm)}


def summarize(result: dict, prompts: int) -> dict:
    """Medians of steps 2..N (step 1 alone if it is all there is) and the figures of the table."""
    steps = result.get("steps") or []
    if not steps:
        return {}
    warm, med = steady_medians(steps)
    step_key = "timing_s/step" if result["side"] == "verl" else "timing/step"
    sampled = prompts * SAMPLES * RESPONSE_TOKENS
    summary = {"steps_run": len(steps), "steady_steps": len(warm), "step_s": med.get(step_key),
               "step_s_each": [s.get(step_key) for s in steps], "medians": med}
    if summary["step_s"]:
        summary["completion_tokens_per_s"] = sampled / summary["step_s"]
    if result["side"] == "verl":
        summary["stages"] = {"generate": med.get("timing_s/gen"), "old_log_prob": med.get("timing_s/old_log_prob"),
                             "update": med.get("timing_s/update_actor"), "sync": med.get("timing_s/update_weights"),
                             "reward": med.get("timing_s/reward")}
        summary["response_length_mean"] = med.get("response_length/mean")
        # verl 0.9.1 logs the actor's torch peaks as actor/perf/*: its vLLM server's memory is not in them.
        summary["own_peak_gib"] = {"actor_max_allocated": max((s.get("actor/perf/max_memory_allocated_gb", 0.0)
                                                               for s in steps), default=None),
                                   "actor_max_reserved": max((s.get("actor/perf/max_memory_reserved_gb", 0.0)
                                                              for s in steps), default=None)}
    else:
        summary["stages"] = {"generate": med.get("timing/generate"), "old_log_prob": med.get("timing/old_log_prob"),
                             "update": med.get("timing/update_actor"), "sync": med.get("timing/weight_sync"),
                             "reward": med.get("timing/reward")}
        summary["response_length_mean"] = med.get("response_length/mean")
        peaks = {"training": max((s.get("memory/actor_peak_gb", 0.0) for s in steps), default=None),
                 "rollout": max((s.get("memory/rollout_peak_gb", 0.0) for s in steps), default=None)}
        summary["own_peak_gib"] = peaks
        summary["startup_total_s"] = steps[0].get("timing/startup_total")
        estimate = result.get("estimate_gib") or {}
        summary["estimate_over_peak"] = {phase: estimate[phase] / peak for phase, peak in peaks.items()
                                         if peak and phase in estimate}
    return summary


# Composes as the entry point's @hydra.main does, from the config folder (finding verl without importing it, so
# that the composition alone also runs where verl's compiled dependencies do not import), applies what the one-step
# recipe's main() does before its trainer starts (the top-level rollout pool copied into actor_rollout_ref.rollout),
# then runs verl's own validate_config; exit 3: composed, but verl would not import here to validate.
VERL_COMPOSE = """import sys
from importlib.util import find_spec
from pathlib import Path
from hydra import compose, initialize_config_dir
from omegaconf import OmegaConf
target, folder, name, overrides = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4:]
with initialize_config_dir(config_dir=str(Path(find_spec("verl").origin).parent / folder), version_base=None):
    cfg = compose(name, overrides=overrides)
if OmegaConf.select(cfg, "rollout.n_gpus_per_node") is not None:
    cfg.actor_rollout_ref.rollout.nnodes = cfg.rollout.nnodes
    cfg.actor_rollout_ref.rollout.n_gpus_per_node = cfg.rollout.n_gpus_per_node
with open(target, "w") as out:  # not stdout: validate_config prints there
    out.write(OmegaConf.to_yaml(cfg, resolve=True))
try:
    from verl.trainer.ppo.utils import need_critic, need_reference_policy
    from verl.utils.config import validate_config
except ImportError as exc:
    print(f"composed; verl's validate_config not run: verl does not import here ({exc})")
    sys.exit(3)
validate_config(cfg, use_reference_policy=need_reference_policy(cfg), use_critic=need_critic(cfg))
"""


def verl_config(overrides: list[str], verl_site: str, target: Path, entry: tuple[str, str, str] = VERL_MAIN) -> tuple[int, str]:
    """verl's whole config for these overrides, as `entry` composes and checks it, written to `target`."""
    with tempfile.TemporaryDirectory() as tmp:
        cwd = verl_workdir(Path(tmp), verl_site)
        proc = subprocess.run([sys.executable, "-c", VERL_COMPOSE, str(target), entry[1], entry[2], *overrides], cwd=cwd,
                              capture_output=True, text=True, env=verl_env(verl_site))
    if proc.returncode:
        return proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    return 0, f"{len(target.read_text().splitlines())} lines of config in {target}"


# --- checks on the CPU ----------------------------------------------------------------------------


def rlconf_fit(overrides: list[str], gpu_gib: float = H100_GIB) -> dict:
    """`rlconf explain -f json` of the bench's plan (an empty plan file and `overrides`) for a GPU of `gpu_gib`:
    its exit, diagnostics, memory estimate per phase and whether every phase fits (no error, no RL609)."""
    with tempfile.TemporaryDirectory() as tmp:
        plan = Path(tmp) / "plan.yaml"
        plan.write_text("{}\n")
        proc = subprocess.run([sys.executable, "-m", "rlconf", "explain", "-f", "json", str(plan), *overrides,
                               f"estimate.gpu_memory_gib={gpu_gib}"], cwd=ROOT, capture_output=True, text=True)
    try:
        explained = json.loads(proc.stdout)
    except json.JSONDecodeError:
        return {"exit": proc.returncode, "fits": False, "output": (proc.stdout + proc.stderr)[-3000:]}
    diagnostics = explained.get("diagnostics") or []
    memory = {f"{m['pool']}/{m['phase']}": m["total_gib"] for m in explained.get("memory") or []}
    errors = [d for d in diagnostics if d["severity"] == "error"]
    fits = (proc.returncode == 0 and not errors and bool(memory) and all(v <= gpu_gib for v in memory.values())
            and not any(d["code"] == "RL609" for d in diagnostics))
    return {"exit": proc.returncode, "fits": fits, "memory_gib": memory, "gpu_memory_gib": gpu_gib,
            "diagnostics": [f"{d['severity']}[{d['code']}]: {d['message']}" for d in diagnostics]}


def check(workloads: list[str], steps: int, verl_site: str, extra: list[str] = ()) -> int:
    """rlconf compiles each side's overrides (the workload's random:// model, so that its shape is known) and its
    memory estimate fits an H100; verl composes its Hydra config and runs its validate_config."""
    failed = 0
    for name in workloads:
        workload = WORKLOADS[name]
        shared = shared_overrides(workload.model, "/data", workload, steps, name, extra)
        for side in ("rlconf", *SIDE_ADDS):
            if (why := not_for(side, workload)) is not None:
                print(f"rlconf explain ({name}, {side}): not run, {why}")
                continue
            fit = rlconf_fit(side_overrides(side, shared))
            memory = ", ".join(f"{phase} {gib:.1f} GiB" for phase, gib in fit.get("memory_gib", {}).items())
            print(f"rlconf explain ({name}, {side}, {workload.model}, {workload.gpus} GPU): exit {fit['exit']}, "
                  f"{'fits' if fit['fits'] else 'DOES NOT FIT'} {H100_GIB} GiB: {memory or fit.get('output')}")
            for line in fit.get("diagnostics", []):
                print(f"  {line}")
            failed += not fit["fits"]
        target = Path(tempfile.gettempdir()) / f"verl_side_by_side_{name}.yaml"
        code, tail = verl_config(shared, verl_site, target)
        print(f"verl compose + validate_config ({name}): exit {code}\n{tail}")
        failed += code != 0
    return 1 if failed else 0


# --- the table ------------------------------------------------------------------------------------


def fmt(value, spec: str = ".2f") -> str:
    return "-" if value is None else format(value, spec)


def table(results: dict) -> str:
    lines = ["| workload | side | step s | completion tok/s | generate s | old log-prob s | update s | sync s | "
             "time to step 1 s | device peak GiB | own peak GiB | est ÷ peak |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|"]
    for name, runs in results.get("workloads", {}).items():
        for side, run in runs.items():
            s = run.get("summary") or {}
            if not s:
                lines.append(f"| {name} | {side} | failed: exit {run.get('exit')} |||||||||||")
                continue
            st = s["stages"]
            own = ", ".join(f"{k} {v:.2f}" for k, v in s.get("own_peak_gib", {}).items() if v)
            est = ", ".join(f"{k} {v:.2f}" for k, v in s.get("estimate_over_peak", {}).items())
            # one step is a first step (start-up compiles, nothing cached): no steady figure, and the row says so
            step = fmt(s['step_s']) + (" (step 1 only)" if s.get("steps_run", 0) < 2 else "")
            lines.append(f"| {name} | {side} | {step} | {fmt(s.get('completion_tokens_per_s'), ',.0f')} | "
                         f"{fmt(st['generate'])} | {fmt(st['old_log_prob'])} | {fmt(st['update'])} | {fmt(st['sync'], '.3f')} | "
                         f"{fmt(run.get('time_to_first_step_s'), '.1f')} | {fmt(run.get('device_peak_used_gib'))} | "
                         f"{own or '-'} | {est or '-'} |")
    return "\n".join(lines)


def report(path: Path, verl_logs: list[str]) -> dict:
    """A results file with every summary recomputed from its steps, plus verl runs read from their console logs."""
    results = json.loads(path.read_text())
    for spec in verl_logs:
        name, _, log = spec.partition("=")
        steps: dict[int, dict[str, float]] = {}
        first = None
        for line in Path(log).read_text(errors="replace").splitlines():
            parsed = parse_verl_line(line)
            if parsed:
                steps[parsed[0]] = parsed[1]
                stamp = re.match(r"\[\s*([\d.]+)\]", line)  # run_side's seconds-since-start prefix
                if first is None and stamp:
                    first = float(stamp.group(1))
        results.setdefault("workloads", {}).setdefault(name, {})["verl"] = {
            "side": "verl", "label": f"{name}_verl", "exit": None, "time_to_first_step_s": first,
            "device_peak_used_gib": None, "steps": [steps[k] for k in sorted(steps)], "from_log": log}
    for name, runs in results.get("workloads", {}).items():
        for run in runs.values():
            run["summary"] = summarize(run, WORKLOADS[name].prompts)
    return results


def run_one(name: str, side: str, workload: Workload, shared: list[str], out: Path, timeout: float, verl_site: str,
            steps: int, entry: tuple[str, str, str] = VERL_MAIN, deadline: float | None = None,
            label: str | None = None) -> dict:
    """One side of one workload on the workload's GPUs (nvidia-smi watches all of them); verl's config is composed
    and written beside its log first, and its run is stopped once its last step is on its console. `deadline`: the
    run, and the wait for the GPUs to empty after it, end there at the latest."""
    if side == "verl":
        code, tail = verl_config(shared, verl_site, out / f"{name}_verl_config.yaml", entry)
        print(f"verl config ({name}): exit {code}: {tail}", flush=True)
    run = run_side(side, side_overrides(side, shared), out, f"{name}_{label or side}", timeout, verl_site, entry=entry,
                   gpus=workload.gpu_ids, stop_after_steps=steps if side == "verl" else None, deadline=deadline)
    run["summary"] = summarize(run, workload.prompts)
    return run


MIN_RUN_S = 120  # a run with less of the budget left is not started: neither side reaches its first step sooner


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="w1,w2", help=f"of {', '.join(WORKLOADS)}")
    parser.add_argument("--sides", default="rlconf,verl,rlconf_best")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--verl-site", default="/tmp/verlsite", help="folder with verl 0.9.1 and its packages")
    parser.add_argument("--verl-ready", default=None, help="wait for this file before the first verl run")
    parser.add_argument("--verl-ready-timeout-s", type=float, default=600)
    parser.add_argument("--budget-s", type=float, default=None,
                        help=f"start no run with less than {MIN_RUN_S} s of it left; stop any run at it")
    parser.add_argument("--run-timeout-s", type=float, default=600)
    parser.add_argument("--out", default=None, help="where files go (default: $OUT, else a temp dir)")
    parser.add_argument("--verl-log", action="append", default=[], metavar="WORKLOAD=PATH",
                        help="with --report: a verl run's console log whose result is not in the file (a killed run)")
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--print-overrides", action="store_true")
    parser.add_argument("--prepare-only", action="store_true", help="build the workloads' model directories, then exit")
    parser.add_argument("--report", default=None)
    parser.add_argument("overrides", nargs="*", help="extra key=value overrides given to every side alike (verl's "
                        "spelling), after the workload's: e.g. actor_rollout_ref.model.use_fused_kernels=true")
    args = parser.parse_args()
    names = args.workloads.split(",")
    unknown = [name for name in names if name not in WORKLOADS]
    if unknown:
        parser.error(f"--workloads: {', '.join(unknown)} unknown; known: {', '.join(WORKLOADS)}")
    strangers = [side for side in args.sides.split(",") if side not in SIDES]
    if strangers:  # a misspelt side would run plain rlconf under its name
        parser.error(f"--sides: {', '.join(strangers)} unknown; known: {', '.join(SIDES)}")
    if args.report:
        print(table(report(Path(args.report), args.verl_log)))
        return
    if args.print_overrides:
        for name in names:
            workload = WORKLOADS[name]
            print(" ".join(shared_overrides("$MODEL", "$DATA", workload, args.steps, name, args.overrides)))
            print(f"# {name}: $MODEL = the directory prepare() builds for {workload.model}; GPUs {workload.gpu_ids}")
        for side, adds in SIDE_ADDS.items():
            print(f"{side} adds:", " ".join(adds))
        return
    if args.check:
        sys.exit(check(names, args.steps, args.verl_site, args.overrides))

    began = time.perf_counter()
    work = Path(tempfile.gettempdir()) / "verl_side_by_side"
    work.mkdir(exist_ok=True)
    model_dirs: dict[str, str] = {}  # built once a model, when the first workload of that model comes
    prepare_s: dict[str, float] = {}

    def model_dir_of(model: str) -> tuple[str, str]:
        started = time.perf_counter()
        model_dir, data_dir = prepare(work, model)  # at once when built before (a marker file says so)
        if model not in model_dirs:
            model_dirs[model], prepare_s[model] = model_dir, time.perf_counter() - started
            print(f"prepared {model} in {prepare_s[model]:.1f} s: {model_dir}, data {data_dir}", flush=True)
        return model_dir, data_dir

    if args.prepare_only:
        for model in dict.fromkeys(WORKLOADS[name].model for name in names):
            started = time.perf_counter()
            print(f"{model}: {prepare_model(model)} ({time.perf_counter() - started:.1f} s)", flush=True)
        return
    # --out first: a run kept going in the background across device calls must not write into $OUT,
    # which each call empties (an open log there is unlinked under the run).
    out = Path(args.out or os.environ.get("OUT") or tempfile.mkdtemp(prefix="sbs_out_"))
    out.mkdir(parents=True, exist_ok=True)
    results: dict = {"command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "date": time.strftime("%Y-%m-%d %H:%M"),
                     "plans": {name: asdict(WORKLOADS[name]) for name in names}, "model_dirs": model_dirs,
                     "data_dir": str(work / "data"), "rlconf_best_adds": RLCONF_BEST, "rlconf_mp_adds": RLCONF_MP, "prepare_s": prepare_s,
                     "workloads": {}, "skipped": []}
    if shutil.which("nvidia-smi"):
        results["device"] = subprocess.run(["nvidia-smi", "--query-gpu=name,memory.total,driver_version",
                                            "--format=csv,noheader"], capture_output=True, text=True).stdout.strip()
    stop_on_sigterm()
    run_workloads(args, names, results, model_dir_of, out, began)
    sys.exit(finish(results, out))


def finish(results: dict, out: Path) -> int:
    """results.json (the skipped and interrupted runs too) and the table; the exit code: 143 after a SIGTERM."""
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    if STOP.is_set():
        print("stopped by SIGTERM: results.json holds the runs measured until then", flush=True)
        return 143
    return 0


def short_of_budget(results: dict, name: str, side: str, left: float, budget_s: float | None) -> bool:
    """A run with less than MIN_RUN_S of the budget left is skipped, and says so."""
    if left >= MIN_RUN_S:
        return False
    results["skipped"].append(f"{name}/{side}")
    print(f"--- {name}/{side} skipped: {left:.0f} s of the {budget_s:.0f} s budget left", flush=True)
    return True


def not_for(side: str, workload: Workload) -> str | None:
    """Why a side does not run on a workload, or None: vLLM in processes of its own runs replicas of one GPU only
    (RL372), so not w4's tensor-parallel rollout."""
    if side == "rlconf_mp" and workload.rollout_tp > 1:
        return f"its rollout is tensor parallel over {workload.rollout_tp} GPUs, which the mp layout does not run (RL372)"
    return None


def side_labels(sides: list[str]) -> list[tuple[str, str]]:
    """(side, label) in order: a side named again (interleaved rounds, `rlconf,rlconf_mp,rlconf_mp,rlconf`) runs
    again under `<side>_r2`, `_r3`, ... so that no run's files or results replace another's."""
    seen: dict[str, int] = {}
    out = []
    for side in sides:
        seen[side] = seen.get(side, 0) + 1
        out.append((side, side if seen[side] == 1 else f"{side}_r{seen[side]}"))
    return out


def run_workloads(args: argparse.Namespace, names: list[str], results: dict, model_dir_of, out: Path,
                  began: float) -> None:
    """Every workload's sides in turn, results.json rewritten after each run; none starts after a SIGTERM (STOP)."""
    deadline = None if args.budget_s is None else began + args.budget_s

    def budget_left() -> float:
        return float("inf") if deadline is None else deadline - time.perf_counter()

    for name in names:
        workload = WORKLOADS[name]
        model_dir, data_dir = model_dir_of(workload.model)
        shared = shared_overrides(model_dir, data_dir, workload, args.steps, name, args.overrides)
        results["workloads"][name] = {}
        for side, label in side_labels(args.sides.split(",")):
            if STOP.is_set():
                return
            if (why := not_for(side, workload)) is not None:
                results["skipped"].append(f"{name}/{label}")
                print(f"--- {name}/{label} skipped: {why}", flush=True)
                continue
            if short_of_budget(results, name, label, budget_left(), args.budget_s):
                continue
            if side == "verl" and args.verl_ready and not wait_for(Path(args.verl_ready), args.verl_ready_timeout_s):
                results["skipped"].append(f"{name}/{label}")
                print(f"--- {name}/{label} skipped: {args.verl_ready} did not appear", flush=True)
                continue
            if STOP.is_set():
                return
            if short_of_budget(results, name, label, budget_left(), args.budget_s):  # the wait came out of it
                continue
            # The run, and the wait for the GPUs to empty after it, end at the budget's end (a device call's limit is a
            # little beyond --budget-s).
            run = run_one(name, side, workload, shared, out, args.run_timeout_s, args.verl_site, args.steps,
                          deadline=deadline, label=label)
            results["workloads"][name][label] = run
            print(f"{name}/{label}: exit {run['exit']}, {json.dumps(run['summary'].get('step_s'))} s/step, "
                  f"first step at {run['time_to_first_step_s']} s", flush=True)
            (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
