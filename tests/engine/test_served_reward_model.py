"""A reward model served by vLLM (verl 0.9.1's reward loop), on CPU with a stand-in for vLLM.

The stand-in (`FakeVLLM`, put in sys.modules as `vllm`) is a `vllm.LLM` whose `classify` returns a
known function of each text (`fake_score`) as the last entry of `probs`, and which logs every call
(start, sleep, wake-up, classify) in one list with the actor's calls. Everything else is the real
path: the worker (engine/workers/roles/served_reward_model.py), the texts the controller renders
(engine.rewards.retemplate.RewardLoopPrompts), the reward stage's sharding over replicas, and a
training step built by engine.trainer.build_trainer. tests/engine/test_served_reward_model_gpu.py
serves the hand-set tiny reward model with real vLLM.
"""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from launching import compile_preset, train_in_process  # noqa: E402
from test_reward_model_input_tokenizer import CHATS, policy_rows, reward_tokenizer  # noqa: E402

GIB = 1024**3
SERVED = ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=1", "reward_model.rollout.name=vllm",
          "reward_model.rollout.tensor_model_parallel_size=1", "reward_model.rollout.gpu_memory_utilization=0.3"]
OWN_POOL = ["reward_model.enable_resource_pool=true", "reward_model.nnodes=1", "reward_model.n_gpus_per_node=2"]


def fake_score(text: str) -> float:
    """What the stand-in's classify returns for a text: its digits and its length, so every row scores apart."""
    return sum(ch.isdigit() for ch in text) + len(text) / 1000


class FakeVLLM:
    """The parts of vLLM's offline API the worker uses, logging each call to `events`."""

    def __init__(self, events: list[tuple[str, ...]]) -> None:
        self.events = events
        self.peak_resets = 0  # torch.cuda.reset_peak_memory_stats calls (the fixture counts them)
        fake = self

        class PoolingParams:
            def __init__(self, use_activation: bool | None = None) -> None:
                self.use_activation = use_activation

        class PoolerConfig:
            def __init__(self, task: str | None = None) -> None:
                self.task = task

            def __eq__(self, other: object) -> bool:
                return isinstance(other, PoolerConfig) and other.task == self.task

        self.config = types.ModuleType("vllm.config")  # a submodule of its own, as in vLLM
        self.config.PoolerConfig = PoolerConfig

        class LLM:
            def __init__(self, **kwargs: Any) -> None:
                self.kwargs, self.asleep = kwargs, False
                fake.llms.append(self)
                events.append(("rm", "start"))

            def classify(self, prompts, *, pooling_params=None, use_tqdm=True):
                assert not self.asleep, "classify on a sleeping engine"
                assert pooling_params.use_activation is False and use_tqdm is False
                events.append(("rm", "classify", len(prompts)))
                fake.classified.append(list(prompts))
                too_long = [p for p in prompts if len(p) > fake.max_chars]
                if too_long:
                    raise ValueError(f"The decoder prompt (length {len(too_long[0])}) is longer than the maximum "
                                     "model length of 64.")
                return [types.SimpleNamespace(outputs=types.SimpleNamespace(probs=[-9.0, fake_score(p)]))
                        for p in prompts]

            def sleep(self, level: int = 1) -> None:
                assert self.kwargs["enable_sleep_mode"], "sleep without enable_sleep_mode"
                self.asleep = True
                events.append(("rm", "sleep", level))

            def wake_up(self, tags=None) -> None:
                if fake.wake_error is not None:
                    raise fake.wake_error
                self.asleep = False
                events.append(("rm", "wake_up"))

            def reset_prefix_cache(self) -> bool:
                return True

        self.llms: list[Any] = []
        self.classified: list[list[str]] = []
        self.max_chars = 10**9
        self.wake_error: Exception | None = None
        self.module = types.ModuleType("vllm")
        self.module.LLM, self.module.PoolingParams = LLM, PoolingParams


@pytest.fixture
def events() -> list[tuple[str, ...]]:
    return []


@pytest.fixture
def fake_vllm(monkeypatch: pytest.MonkeyPatch, events) -> FakeVLLM:
    fake = FakeVLLM(events)
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    monkeypatch.setitem(sys.modules, "vllm.config", fake.config)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *args: (60 * GIB, 80 * GIB))
    # The scoring's peak: reset at each wake-up, read after it (vLLM's pool and its activations, in GiB).
    peaks = iter(range(30, 100))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda *args: setattr(fake, "peak_resets",
                                                                                     fake.peak_resets + 1))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda *args: next(peaks) * GIB)
    return fake


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path


class Replicas:
    """Several one-rank workers in this process, called as a worker group is (one shard each)."""

    def __init__(self, worker_cls: type, world_size: int, **kwargs: Any) -> None:
        self.world_size = world_size
        self.workers = [worker_cls(rank=rank, world_size=world_size, **kwargs) for rank in range(world_size)]

    def call_all(self, method: str, *args: Any) -> list[Any]:
        return [getattr(worker, method)(*args) for worker in self.workers]

    def call_sharded(self, method: str, shards: list[Any]) -> list[Any]:
        assert len(shards) == self.world_size
        return [getattr(worker, method)(shard) for worker, shard in zip(self.workers, shards, strict=True)]


# --- the texts -------------------------------------------------------------------------------------

# verl's reward loop for CHATS and RESPONSES, written out by hand: the policy's EOS text gone, the chat in the
# reward model's template (a Llama-2-like one that starts with its BOS "<s>"), that leading BOS removed.
EXPECTED_LLAMA_LIKE = [
    "[INST] Add 12 and 30. [/INST] The answer is 42</s>",
    "[INST] What is 7 times 6? [/INST] 42</s>",
    "[INST] Name a colour. [/INST] blue blue blue blue blue blue blue blue</s>",
    "[INST] Count to 5. [/INST] </s>",
]
# The same rows for a reward model on the tiny policy's own tokenizer (ChatML; its template writes no BOS).
EXPECTED_CHATML = [
    "<|im_start|>user\nAdd 12 and 30.<|im_end|>\n<|im_start|>assistant\nThe answer is 42<|im_end|>\n",
    "<|im_start|>user\nWhat is 7 times 6?<|im_end|>\n<|im_start|>assistant\n42<|im_end|>\n",
    "<|im_start|>user\nName a colour.<|im_end|>\n<|im_start|>assistant\nblue blue blue blue blue blue blue blue"
    "<|im_end|>\n",
    "<|im_start|>user\nCount to 5.<|im_end|>\n<|im_start|>assistant\n<|im_end|>\n",
]


@pytest.fixture(scope="module")
def policy(tiny_model_dir):
    from engine.models.loading import load_tokenizer

    return load_tokenizer(tiny_model_dir)


def test_the_texts_are_verls_reward_loop_prompts(policy):
    from engine.rewards.retemplate import RewardLoopPrompts

    batch = policy_rows(policy)
    reward = reward_tokenizer()
    for reward_tok, expected in ((reward, EXPECTED_LLAMA_LIKE), (policy, EXPECTED_CHATML)):
        texts = RewardLoopPrompts(policy, reward_tok).texts(CHATS, batch["responses"], batch["attention_mask"])
        assert texts == expected
    # With the BOS kept (the FSDP worker's re-rendering) the first text starts with it.
    from engine.rewards.retemplate import render_chats

    assert render_chats(policy, reward, CHATS, batch["responses"], batch["attention_mask"])[0] == \
        "<s>" + EXPECTED_LLAMA_LIKE[0]


def test_a_reward_model_tokenizer_without_a_chat_template_is_refused_with_the_fix(policy):
    from engine.rewards.retemplate import RewardLoopPrompts

    reward = reward_tokenizer()
    reward.chat_template = None
    with pytest.raises(ValueError, match=r"served .* chat template.*use_reward_loop=false"):
        RewardLoopPrompts(policy, reward)


# --- the worker and the reward stage ---------------------------------------------------------------

def served_plan(*overrides: str):
    return compile_preset("ppo_reward_model.yaml", [*SERVED, *overrides])


def test_the_stage_shards_texts_over_replicas_and_scores_come_back_in_row_order(fake_vllm, cache, policy, events):
    from engine.controller.stages import StepStages
    from engine.rewards.retemplate import RewardLoopPrompts
    from engine.workers.roles.served_reward_model import ServedRewardModelWorker

    resolved = served_plan("trainer.n_gpus_per_node=2")
    served = resolved.roles.served_reward_model
    assert (served.replicas, served.colocated) == (2, True)
    group = Replicas(ServedRewardModelWorker, 2, resolved=resolved, model_path="/models/rm")
    infos = group.call_all("init_model")
    assert [info["sleeps"] for info in infos] == [True, True]
    (llm, _) = fake_vllm.llms
    assert llm.kwargs == {"model": "/models/rm", "runner": "pooling", "dtype": "bfloat16", "tensor_parallel_size": 1,
                          "gpu_memory_utilization": 0.3, "max_num_seqs": 1024, "max_num_batched_tokens": 8192,
                          "seed": resolved.config.trainer.seed, "enable_sleep_mode": True, "trust_remote_code": False,
                          "pooler_config": fake_vllm.config.PoolerConfig(task="classify")}
    batch = policy_rows(policy)
    prompts = RewardLoopPrompts(policy, reward_tokenizer())
    stages = StepStages(resolved, actor=None, critic=None, rewards=None, decode=None, reward_model=group,
                        rm_inputs=prompts)
    rows = torch.cat([torch.arange(4), torch.tensor([1, 0, 3])])  # 7 rows: 4 + 3 over two replicas
    batch = {name: value[rows] for name, value in batch.items()}
    chats = [CHATS[i] for i in rows.tolist()]
    scores = stages.reward_model_scores(batch, chats)
    texts = prompts.texts(chats, batch["responses"], batch["attention_mask"])
    assert scores.dtype == torch.float32
    assert scores.tolist() == pytest.approx([fake_score(text) for text in texts], abs=1e-6)
    assert fake_vllm.classified == [texts[:4], texts[4:]]  # contiguous chunks, as verl chunks the batch
    # Each replica woke for its chunk and slept again.
    assert [e for e in events if e[0] == "rm"] == [("rm", "start"), ("rm", "sleep", 1)] * 2 + [
        ("rm", "wake_up"), ("rm", "classify", 4), ("rm", "sleep", 1),
        ("rm", "wake_up"), ("rm", "classify", 3), ("rm", "sleep", 1)]
    assert fake_vllm.peak_resets == 2  # one a scoring, after its wake-up
    timings = stages.served_reward_model_timings()
    assert set(timings) == {"timing/reward_model_wake", "timing/reward_model_score_in_worker",
                            "timing/reward_model_sleep", "memory/reward_model_device_used_gb",
                            "memory/reward_model_peak_gb"}
    assert timings["memory/reward_model_device_used_gb"] == pytest.approx(20.0)  # 80 GiB − 60 free, while awake
    assert timings["memory/reward_model_peak_gb"] == pytest.approx(31.0)  # the larger of the replicas' peaks: 30, 31
    assert stages.served_reward_model_timings() == {}  # taken: counted once


def test_a_reward_model_on_its_own_pool_never_sleeps(fake_vllm, cache, events):
    from engine.workers.roles.served_reward_model import ServedRewardModelWorker

    resolved = served_plan(*OWN_POOL)
    assert resolved.roles.served_reward_model.pool == "reward_pool"
    group = Replicas(ServedRewardModelWorker, 2, resolved=resolved, model_path="/models/rm")
    assert [info["sleeps"] for info in group.call_all("init_model")] == [False, False]
    assert group.call_sharded("compute_rm_score", [["a1"], ["b22"]]) == [[fake_score("a1")], [fake_score("b22")]]
    assert {llm.kwargs["enable_sleep_mode"] for llm in fake_vllm.llms} == {False}
    assert [e[1] for e in events] == ["start", "start", "classify", "classify"]


def test_too_little_free_memory_is_refused_before_vllm_starts(fake_vllm, cache, monkeypatch):
    from engine.rollout.vllm import RolloutSetupError
    from engine.workers.roles.served_reward_model import ServedRewardModelWorker

    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda *args: (20 * GIB, 80 * GIB))
    worker = ServedRewardModelWorker(served_plan(), "/models/rm", rank=0, world_size=1)
    with pytest.raises(RolloutSetupError) as caught:
        worker.init_model()
    message = str(caught.value)
    assert "reward_model.rollout.gpu_memory_utilization=0.3 asks vLLM for 24.0 GiB" in message
    assert "only 20.0 GiB are free" in message and "at most 0.23" in message and "enable_resource_pool" in message
    assert fake_vllm.llms == []


def test_missing_vllm_a_too_long_text_and_a_failed_wake_up_say_what_to_do(fake_vllm, cache, monkeypatch):
    from engine.rollout.vllm import RolloutSetupError
    from engine.workers.roles.served_reward_model import ServedRewardModelWorker

    worker = ServedRewardModelWorker(served_plan("reward_model.rollout.max_model_len=16"), "/m", rank=0, world_size=1)
    worker.init_model()
    fake_vllm.max_chars = 5
    with pytest.raises(ValueError, match=r"raise reward_model.rollout.max_model_len .*\(16\)|max_model_len \(16\)"):
        worker.compute_rm_score(["a longer text"])
    fake_vllm.wake_error = torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
    worker.asleep = True
    with pytest.raises(RuntimeError, match=r"could not map its weights and KV cache back \(24\.0 GiB"):
        worker.compute_rm_score(["x"])
    monkeypatch.setitem(sys.modules, "vllm", None)  # `import vllm` raises ImportError
    with pytest.raises(RolloutSetupError, match=r"reward_model.rollout.name=vllm, but vLLM cannot be imported.*"
                                                r"use_reward_loop=false"):
        ServedRewardModelWorker(served_plan(), "/m", rank=0, world_size=1).init_model()


# --- a training step ---------------------------------------------------------------------------------

def recording_factory(events: list[tuple[str, ...]]):
    """build_trainer's group factory: in-process one-rank groups whose calls are logged beside vLLM's."""
    from engine.workers.cluster.local import LocalWorkerGroup

    class Recording(LocalWorkerGroup):
        def _call(self, method: str, *args: Any) -> Any:
            events.append((self.role, method))
            return super()._call(method, *args)

    return Recording


def train_one_step(resolved, run_dir: Path, events, monkeypatch):
    """One step of the plan in this process, with the reward stage's inputs and scores caught on their way."""
    from engine.controller.stages import StepStages

    import engine.controller.stages as stages_module

    caught: dict[str, Any] = {}
    score = StepStages.score
    token_scores = stages_module.outcome_token_scores

    def catch_score(self, samples, batch):
        caught.update(samples=samples, batch=batch)
        caught["scores"] = score(self, samples, batch)[1]
        return caught["scores"].tolist(), caught["scores"]

    def catch_token_scores(scores, response_mask):  # the advantages stage's token rewards (before any KL term)
        caught["token_level_rewards"] = token_scores(scores, response_mask)
        return caught["token_level_rewards"]

    monkeypatch.setattr(StepStages, "score", catch_score)
    monkeypatch.setattr(stages_module, "outcome_token_scores", catch_token_scores)
    from engine.startup import StartupClock

    trainer = train_in_process(resolved, run_dir, factory=recording_factory(events), startup=StartupClock())
    return trainer, caught


def verl_texts(policy, reward, chats, batch) -> list[str]:
    """verl's RewardLoopWorker._preprocess_reward_inputs, written out per row."""
    width = batch["responses"].shape[1]
    out = []
    for chat, ids, mask in zip(chats, batch["responses"], batch["attention_mask"], strict=True):
        valid = int(mask[-width:].sum())
        response = policy.decode(ids[:valid]).replace(policy.eos_token, "")
        text = reward.apply_chat_template([*chat, {"role": "assistant", "content": response}],
                                          add_generation_prompt=False, tokenize=False)
        out.append(text[len(reward.bos_token):] if reward.bos_token and text.startswith(reward.bos_token) else text)
    return out


def test_a_training_step_scores_with_the_served_model_asleep_outside_the_reward_stage(fake_vllm, cache, events,
                                                                                      monkeypatch):
    """build_trainer starts the served model last (after the actor and the critic), asleep; in the step it wakes
    after the rollout, scores, and sleeps before the log-prob passes and the updates. Its scores are verl's
    texts' scores, in row order, on each response's last valid token (verl's rm_scores)."""
    from engine.models.loading import load_tokenizer, resolve_model_path

    resolved = served_plan()
    trainer, caught = train_one_step(resolved, cache / "run", events, monkeypatch)
    policy = trainer.tokenizer
    reward = load_tokenizer(resolve_model_path(resolved.config.reward_model.model.path))
    batch, samples = caught["batch"], caught["samples"]
    expected = torch.tensor([fake_score(t) for t in verl_texts(policy, reward, samples.raw_prompts, batch)])
    torch.testing.assert_close(caught["scores"], expected, rtol=0, atol=1e-6)
    # Where verl puts them: rm_scores[i, valid_response_length_i - 1], zeros elsewhere.
    valid = batch["attention_mask"][:, -batch["responses"].shape[1]:].sum(-1)
    assert int(valid.min()) >= 1
    placed = torch.zeros(batch["responses"].shape)
    placed[torch.arange(len(valid)), valid - 1] = expected
    torch.testing.assert_close(caught["token_level_rewards"], placed, rtol=0, atol=1e-6)
    metrics = trainer.history[0]
    assert metrics["reward/mean"] == pytest.approx(float(expected.mean()), abs=1e-5)
    assert metrics["timing/reward_model_wake"] >= 0 and metrics["timing/reward_model_score_in_worker"] >= 0
    assert metrics["timing/startup_reward_model_load"] >= 0

    order = [e[:2] for e in events if e[1] in ("init_model", "start", "sleep", "wake_up", "classify", "generate",
                                               "compute_log_prob", "compute_values", "update_critic", "update_actor")]
    assert order == [
        ("actor_rollout_ref", "init_model"), ("critic", "init_model"),  # the GPU's other residents first
        ("reward_model", "init_model"), ("rm", "start"), ("rm", "sleep"),  # asleep from the start
        ("actor_rollout_ref", "generate"),
        ("rm", "wake_up"), ("rm", "classify"), ("rm", "sleep"),
        ("actor_rollout_ref", "compute_log_prob"), ("critic", "compute_values"), ("critic", "update_critic"),
        ("actor_rollout_ref", "update_actor"),
    ]


def test_a_served_model_on_its_own_pool_scores_a_step_awake(fake_vllm, cache, events, monkeypatch):
    resolved = served_plan(*OWN_POOL[:2], "reward_model.n_gpus_per_node=1")
    trainer, caught = train_one_step(resolved, cache / "run", events, monkeypatch)
    assert [e[1] for e in events if e[0] == "rm"] == ["start", "classify"]
    assert caught["scores"].shape == (resolved.roles.rollout.sequences_per_step,)
    assert "timing/reward_model_sleep" not in trainer.history[0]


# --- what the engine refuses, and where the served model runs ------------------------------------------

def test_the_engine_refuses_only_what_it_does_not_serve_with_the_fix():
    from engine.capabilities import served_reward_model_problems, unsupported_features

    gpu = ["trainer.device=cuda", "actor_rollout_ref.rollout.name=hf"]
    found = lambda: True  # noqa: E731
    assert served_reward_model_problems(served_plan(*gpu), vllm_found=found) == []
    (tp,) = served_reward_model_problems(served_plan(*gpu, "trainer.n_gpus_per_node=2",
                                                     "reward_model.rollout.tensor_model_parallel_size=2"),
                                         vllm_found=found)
    assert "tensor_model_parallel_size=2" in tp and "set reward_model.rollout.tensor_model_parallel_size=1" in tp
    (judge,) = served_reward_model_problems(served_plan(*gpu, "custom_reward_function.path=my_reward.py"),
                                            vllm_found=found)
    assert "reward_router_address" in judge and "remove custom_reward_function" in judge
    (engine,) = served_reward_model_problems(served_plan(*gpu, "reward_model.rollout.name=sglang"), vllm_found=found)
    assert "with vLLM only; set reward_model.rollout.name=vllm" in engine
    (cpu,) = served_reward_model_problems(served_plan())
    assert "needs a GPU" in cpu and cpu in unsupported_features(served_plan())
    (missing,) = served_reward_model_problems(served_plan(*gpu), vllm_found=lambda: False)
    assert "vLLM is not installed" in missing
    GRPO_8 = Path(__file__).resolve().parents[2] / "presets" / "grpo_7b_8gpu.yaml"
    from rlconf.compile import compile_plan

    assert served_reward_model_problems(compile_plan(GRPO_8).resolved) == []


def test_the_served_model_shares_the_actors_gpus_or_has_its_own_pool():
    from engine.workers.cluster.placement import groups_per_pool

    assert groups_per_pool(served_plan()) == {"global": 3}  # actor, critic and the served replicas
    assert groups_per_pool(served_plan(*OWN_POOL)) == {"global": 2, "reward_pool": 1}


def test_a_local_run_counts_the_served_models_own_pool_among_the_gpus_it_needs(monkeypatch):
    import engine.launch
    from engine.launch import local_gpu_shortage

    monkeypatch.setattr(engine.launch, "gpu_count", lambda: 2)
    assert local_gpu_shortage(served_plan("trainer.device=cuda")) is None  # colocated: the trainer's one GPU
    assert local_gpu_shortage(served_plan("trainer.device=cuda", *OWN_POOL[:2], "reward_model.n_gpus_per_node=1")) is None
    message = local_gpu_shortage(served_plan("trainer.device=cuda", *OWN_POOL))
    assert "on 3 GPU(s) (trainer.nnodes × trainer.n_gpus_per_node, and 2 more for the served reward model's own " \
        "pool" in message and "this machine has 2" in message
    assert served_plan("trainer.device=cuda", *OWN_POOL).schedule.total_gpus == 3  # counted once, by the compiler
