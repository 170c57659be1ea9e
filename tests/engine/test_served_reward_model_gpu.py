"""On a CUDA GPU with vLLM: the hand-set tiny reward model served by real vLLM (verl 0.9.1's reward loop).

The reward model is `build_tiny_reward_model` at a head size vLLM's attention kernels take (64), whose
score is `tiny_reward_score` (the fraction of digit tokens) whatever its shape. vLLM serves it with
the pooling runner (its Qwen2ForTokenClassification checkpoint becomes a last-token classifier);
its weights and compute are bfloat16 (reward_model.rollout.dtype, verl's default), hence the
tolerance below. Skipped without a CUDA device or without vLLM (CI has neither). Run on the GPU
machine with `python -m pytest -q -m gpu tests/engine/test_served_reward_model_gpu.py`.
"""

from __future__ import annotations

import importlib.util
import math

import pytest
from launching import compile_preset, launch_preset, read_metrics

torch = pytest.importorskip("torch")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.slow,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (CI has none; run on the GPU machine)"),
    pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="needs vLLM (pip install 'rlconf[vllm]')"),
]

# bfloat16 keeps 8 bits of mantissa: the digit fraction f (at most 1) the attention averages is off by up
# to ~0.4 % of f, and the final norm and head by as much again; 0.01 bounds both with room.
SCORE_ATOL = 1e-2
SMALL_SHAPE = dict(hidden_size=256, num_layers=4, num_heads=4, num_kv_heads=2, intermediate_size=512,
                   max_position_embeddings=1024)
SMALL_REWARD_SHAPE = dict(hidden_size=256, num_heads=4, num_kv_heads=2, intermediate_size=512,
                          max_position_embeddings=1024)
ON_ONE_GPU = ["trainer.device=cuda", "trainer.n_gpus_per_node=1", "actor_rollout_ref.model.dtype=bfloat16",
              "actor_rollout_ref.rollout.dtype=bfloat16", "actor_rollout_ref.rollout.name=vllm",
              "actor_rollout_ref.rollout.gpu_memory_utilization=0.3"]
SERVED = ["reward_model.rollout.name=vllm", "reward_model.rollout.tensor_model_parallel_size=1",
          "reward_model.rollout.gpu_memory_utilization=0.2"]
CHATS = [[{"role": "user", "content": "Add 12 and 30."}], [{"role": "user", "content": "Name a colour."}],
         [{"role": "user", "content": "Count to 5."}], [{"role": "user", "content": "What is 7 times 6?"}]]
RESPONSES = ["42", "blue", "1 2 3 4 5", "It is 42, since 7 times 6 is 42"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    from engine.models.tiny import build_tiny_model, build_tiny_reward_model

    policy = build_tiny_model(tmp_path_factory.mktemp("small_qwen2"), arch="qwen2", **SMALL_SHAPE)
    reward = build_tiny_reward_model(tmp_path_factory.mktemp("small_reward"), **SMALL_REWARD_SHAPE)
    return policy, reward


def rows(tokenizer) -> dict[str, torch.Tensor]:
    """CHATS and RESPONSES (+ EOS) as the rollout lays them out: prompts left-padded, responses right-padded."""
    prompts = [tokenizer(tokenizer.apply_chat_template(chat, add_generation_prompt=True, tokenize=False),
                         add_special_tokens=False)["input_ids"] for chat in CHATS]
    answers = [tokenizer(r, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for r in RESPONSES]
    width_p, width_r = max(map(len, prompts)), max(map(len, answers)) + 2
    input_ids = torch.full((len(CHATS), width_p + width_r), tokenizer.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, (p, a) in enumerate(zip(prompts, answers, strict=True)):
        input_ids[i, width_p - len(p):width_p], mask[i, width_p - len(p):width_p] = torch.tensor(p), 1
        input_ids[i, width_p:width_p + len(a)], mask[i, width_p:width_p + len(a)] = torch.tensor(a), 1
    return {"input_ids": input_ids, "attention_mask": mask, "responses": input_ids[:, width_p:]}


def test_vllm_serves_the_hand_set_reward_model_with_the_formulas_and_the_fsdp_models_scores(models, tmp_path,
                                                                                           monkeypatch):
    """The worker in this process (one vLLM engine per process), through the reward stage: each score is the
    closed form on the text's tokens and the HF model's own (the FSDP worker's model) within SCORE_ATOL."""
    from engine.controller.stages import StepStages
    from engine.models.loading import load_reward_model, load_tokenizer
    from engine.models.tiny import REWARD_TOKENS, tiny_reward_score
    from engine.rewards.retemplate import RewardLoopPrompts
    from engine.workers.cluster.local import LocalWorkerGroup
    from engine.workers.roles.served_reward_model import ServedRewardModelWorker

    policy_dir, reward_dir = models
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("ppo_reward_model.yaml", [*ON_ONE_GPU, *SERVED, f"actor_rollout_ref.model.path={policy_dir}",
                                                        f"reward_model.model.path={reward_dir}"])
    policy, reward = load_tokenizer(policy_dir), load_tokenizer(reward_dir)
    group = LocalWorkerGroup(ServedRewardModelWorker, ServedRewardModelWorker.ROLE, 1, resolved=resolved,
                             model_path=str(reward_dir))
    try:
        (info,) = group.call_all("init_model")
        assert info["sleeps"]  # colocated with free_cache_engine: asleep until it scores
        free_asleep = torch.cuda.mem_get_info()[0]
        prompts = RewardLoopPrompts(policy, reward)
        stages = StepStages(resolved, actor=None, critic=None, rewards=None, decode=None, reward_model=group,
                            rm_inputs=prompts)
        batch = rows(policy)
        scores = stages.reward_model_scores(batch, CHATS)
        # Asleep again after scoring: the KV cache and the weights gave their memory back.
        assert torch.cuda.mem_get_info()[0] >= free_asleep - 0.02 * torch.cuda.mem_get_info()[1]
        assert stages.served_reward_model_timings()["timing/reward_model_wake"] > 0
    finally:
        group.kill()
    texts = prompts.texts(CHATS, batch["responses"], batch["attention_mask"])
    digits = {reward.convert_tokens_to_ids(token) for token in REWARD_TOKENS}
    model = load_reward_model(reward_dir).cuda().eval()
    closed_form, hf = [], []
    for text in texts:
        ids = reward(text)["input_ids"]  # tokenized as vLLM tokenizes a text prompt
        closed_form.append(tiny_reward_score(ids, digits))
        with torch.no_grad():
            hf.append(float(model(input_ids=torch.tensor([ids], device="cuda")).logits[0, -1, 0]))
    assert max(closed_form) - min(closed_form) > 10 * SCORE_ATOL  # the rows score far enough apart to be told apart
    torch.testing.assert_close(scores, torch.tensor(closed_form), rtol=0, atol=SCORE_ATOL)
    torch.testing.assert_close(scores, torch.tensor(hf), rtol=0, atol=SCORE_ATOL)


def test_a_colocated_served_reward_model_scores_training_steps_as_the_fsdp_worker_does(models, tmp_path_factory):
    """PPO on one GPU: the actor's vLLM, the critic and the served reward model's vLLM share it, each engine asleep
    while the other works. Greedy rollout makes step 1's responses the same in both runs, so the served model's
    mean score equals the FSDP reward model's on the same re-rendered texts (input_tokenizer: the policy's)."""
    policy_dir, reward_dir = models
    common = [*ON_ONE_GPU, f"actor_rollout_ref.model.path={policy_dir}", f"reward_model.model.path={reward_dir}",
              "actor_rollout_ref.rollout.do_sample=false", "trainer.total_training_steps=2", "trainer.save_freq=-1"]
    _, served_dir, code = launch_preset(tmp_path_factory, "served_rm", "ppo_reward_model.yaml", [*common, *SERVED])
    assert code == 0, (served_dir / "error.log").read_text() if (served_dir / "error.log").exists() else ""
    served = read_metrics(served_dir)
    assert [m["step"] for m in served] == [1, 2]
    assert all(m["timing/reward_model_wake"] > 0 and m["timing/reward_model_sleep"] > 0 for m in served)
    assert all(math.isfinite(m["actor/pg_loss"]) and 0 <= m["reward/mean"] <= 1 for m in served)
    _, fsdp_dir, code = launch_preset(tmp_path_factory, "fsdp_rm", "ppo_reward_model.yaml",
                                      [*common, "reward_model.use_reward_loop=false",
                                       f"reward_model.model.input_tokenizer={policy_dir}"])
    assert code == 0
    fsdp = read_metrics(fsdp_dir)
    assert served[0]["reward/mean"] == pytest.approx(fsdp[0]["reward/mean"], abs=SCORE_ATOL)
