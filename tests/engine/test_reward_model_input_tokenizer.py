"""reward_model.model.input_tokenizer: a reward model whose tokenizer and chat template differ from the policy's.

As verl's reward model worker (`_switch_chat_template`): each response is decoded with the policy's
tokenizer (its EOS text dropped), appended to the prompt's chat messages as the assistant turn, the
chat rendered with the reward model's template and tokenized with its tokenizer, then cut (or
right-padded) at reward_model.max_length. The reward model here is the hand-set tiny scorer
(`tiny_reward_score`: the fraction of digit tokens) on a tokenizer built below, with another
vocabulary, other special tokens and a Llama-2-like template, so every id differs from the policy's.
"""

from __future__ import annotations

from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

PROMPT_WIDTH, RESPONSE_WIDTH = 32, 12
REWARD_TEMPLATE = ("{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}[INST] {{ m['content'] }} [/INST]"
                   "{% else %} {{ m['content'] }}{{ eos_token }}{% endif %}{% endfor %}")
CHATS = [
    [{"role": "user", "content": "Add 12 and 30."}],
    [{"role": "user", "content": "What is 7 times 6?"}],
    [{"role": "user", "content": "Name a colour."}],
    [{"role": "user", "content": "Count to 5."}],
]
# The policy's responses (its EOS ends the first two; the third runs into the response width; the last is empty).
RESPONSES = ["The answer is 42", "42", "blue blue blue blue blue blue blue blue", ""]
# What verl's procedure renders for each row, written out by hand.
EXPECTED_TEXTS = [
    "<s>[INST] Add 12 and 30. [/INST] The answer is 42</s>",
    "<s>[INST] What is 7 times 6? [/INST] 42</s>",
    None,  # cut by the response width: checked through the decoded response below
    "<s>[INST] Count to 5. [/INST] </s>",
]
SCORE_ATOL = 1e-5


def reward_tokenizer():
    """A byte-level BPE as the tiny policy's (so it reloads as itself), on another corpus, vocabulary size,
    special tokens and chat template."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    from engine.models.tiny import PRETOKENIZE_REGEX

    tok = Tokenizer(models.BPE(unk_token=None, fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=320, special_tokens=["<|endoftext|>", "<s>", "</s>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), min_frequency=1,
                                  show_progress=False)
    tok.train_from_iterator(["[INST] ", " [/INST] ", "Human", "answer", "colour", " blue", " times"] * 50, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<|endoftext|>",
                                   unk_token="<|endoftext|>", clean_up_tokenization_spaces=False)
    fast.chat_template = REWARD_TEMPLATE
    return fast


@pytest.fixture(scope="module")
def reward_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.models.tiny import build_tiny_reward_model

    return build_tiny_reward_model(tmp_path_factory.mktemp("tiny_reward_own_tokenizer"), tokenizer=reward_tokenizer())


def policy_rows(policy) -> dict[str, torch.Tensor]:
    """The rollout's rows for CHATS and RESPONSES: prompts left-padded, responses (+ EOS) right-padded."""
    from engine.batch import position_ids_from_mask

    rows = len(CHATS)
    input_ids = torch.full((rows, PROMPT_WIDTH + RESPONSE_WIDTH), policy.pad_token_id, dtype=torch.long)
    mask = torch.zeros_like(input_ids)
    for i, (chat, response) in enumerate(zip(CHATS, RESPONSES, strict=True)):
        prompt = policy(policy.apply_chat_template(chat, add_generation_prompt=True, tokenize=False),
                        add_special_tokens=False)["input_ids"]
        answer = (policy(response, add_special_tokens=False)["input_ids"] + [policy.eos_token_id])[:RESPONSE_WIDTH]
        input_ids[i, PROMPT_WIDTH - len(prompt):PROMPT_WIDTH] = torch.tensor(prompt)
        mask[i, PROMPT_WIDTH - len(prompt):PROMPT_WIDTH] = 1
        input_ids[i, PROMPT_WIDTH:PROMPT_WIDTH + len(answer)] = torch.tensor(answer)
        mask[i, PROMPT_WIDTH:PROMPT_WIDTH + len(answer)] = 1
    return {"input_ids": input_ids, "attention_mask": mask, "position_ids": position_ids_from_mask(mask),
            "responses": input_ids[:, PROMPT_WIDTH:], "response_mask": mask[:, PROMPT_WIDTH:]}


def verl_procedure(policy, reward, chat, response_ids: list[int], max_length: int) -> tuple[list[int], list[int]]:
    """verl's per-row steps, written out: decode (special tokens kept), drop the EOS text, render, tokenize, cut/pad."""
    response = policy.decode(response_ids).replace(policy.eos_token, "")
    text = reward.apply_chat_template([*chat, {"role": "assistant", "content": response}], add_generation_prompt=False,
                                      tokenize=False)
    ids = reward(text, add_special_tokens=False)["input_ids"][:max_length]
    pad = max_length - len(ids)
    return ids + [reward.pad_token_id] * pad, [1] * len(ids) + [0] * pad


@pytest.fixture(scope="module")
def tokenizers(reward_model_dir, tiny_model_dir):
    from engine.models.loading import load_tokenizer

    policy, reward = load_tokenizer(tiny_model_dir), load_tokenizer(reward_model_dir)  # as the launch loads them
    assert reward.chat_template == REWARD_TEMPLATE
    text = "The answer is 42"
    assert policy(text)["input_ids"] != reward(text)["input_ids"]  # the two tokenizers really differ
    return policy, reward


def full_lengths(policy, reward, batch) -> list[int]:
    """Each row's re-rendered length before any cut."""
    return [sum(verl_procedure(policy, reward, chat, ids[mask.bool()].tolist(), 10**4)[1])
            for chat, ids, mask in zip(CHATS, batch["responses"], batch["response_mask"], strict=True)]


def test_rows_are_re_rendered_and_re_tokenized_as_verl_does(tokenizers):
    from engine.rewards.retemplate import ChatTemplateSwitch

    policy, reward = tokenizers
    batch = policy_rows(policy)
    lengths = full_lengths(policy, reward, batch)
    max_length = max(lengths) - 1  # the longest row is cut by one token
    switch = ChatTemplateSwitch(policy, reward, max_length)
    rows = switch.verl_rows(CHATS, batch["responses"], batch["attention_mask"])
    for i, chat in enumerate(CHATS):
        ids, mask = verl_procedure(policy, reward, chat, batch["responses"][i][batch["response_mask"][i].bool()].tolist(),
                                   max_length)
        assert rows["input_ids"][i].tolist() == ids
        assert rows["attention_mask"][i].tolist() == mask
        if EXPECTED_TEXTS[i] is not None:  # the hand-written rendering, cut where verl cuts it
            expected = reward(EXPECTED_TEXTS[i], add_special_tokens=False)["input_ids"]
            assert rows["input_ids"][i][rows["attention_mask"][i].bool()].tolist() == expected[:max_length]
            if len(expected) <= max_length:
                assert reward.decode(expected) == EXPECTED_TEXTS[i]
    assert rows["input_ids"][0, 0] == reward.bos_token_id  # the reward model's template, not the policy's
    truncated = sum(n > max_length for n in lengths)
    assert 1 <= truncated < len(CHATS)
    assert switch.take_metrics() == {"reward/rm_inputs_truncated": truncated}
    assert switch.take_metrics() == {}


def test_the_worker_layout_gives_the_same_tokens_left_padded():
    from engine.rewards.retemplate import worker_rows

    right = {"input_ids": torch.tensor([[5, 6, 7, 0], [8, 0, 0, 0]]), "attention_mask": torch.tensor([[1, 1, 1, 0],
                                                                                                   [1, 0, 0, 0]])}
    rows = worker_rows(right)
    assert rows["input_ids"].tolist() == [[0, 5, 6, 7, 0], [0, 0, 0, 8, 0]]
    assert rows["attention_mask"].tolist() == [[0, 1, 1, 1, 0], [0, 0, 0, 1, 0]]
    assert rows["position_ids"].tolist() == [[0, 0, 1, 2, 0], [0, 0, 0, 0, 0]]
    assert rows["responses"].shape == (2, 1) and rows["response_mask"].sum() == 0


def test_the_reward_model_scores_the_re_rendered_text(tokenizers, reward_model_dir, tiny_model_dir):
    """Through the step's stage and the FSDP worker, each score is the reward model's on the re-rendered text
    tokenized directly, and the closed form of the hand-set model on those ids."""
    from engine.controller.stages import StepStages
    from engine.models.loading import load_reward_model
    from engine.models.tiny import REWARD_TOKENS, tiny_reward_score
    from engine.trainer import chat_template_switch
    from engine.workers.cluster.local import LocalWorkerGroup
    from engine.workers.roles.reward_model import RewardModelWorker
    from rlconf.compile import compile_plan

    policy, reward = tokenizers
    batch = policy_rows(policy)
    lengths = full_lengths(policy, reward, batch)
    max_length = max(lengths) - 1
    preset = Path(__file__).resolve().parents[2] / "presets" / "ppo_reward_model.yaml"
    result = compile_plan(preset, [
        "trainer.n_gpus_per_node=1", f"data.max_prompt_length={PROMPT_WIDTH}", f"data.max_response_length={RESPONSE_WIDTH}",
        f"actor_rollout_ref.model.path={tiny_model_dir}", f"reward_model.model.path={reward_model_dir}",
        f"reward_model.model.input_tokenizer={tiny_model_dir}", f"reward_model.max_length={max_length}",
        "reward_model.micro_batch_size_per_gpu=3"])
    assert result.resolved is not None, [d.message for d in result.diagnostics]
    resolved = result.resolved
    assert "re-templated" in resolved.reward.text and f"max_length {max_length}" in resolved.reward.text
    switch = chat_template_switch(resolved)
    group = LocalWorkerGroup(RewardModelWorker, RewardModelWorker.ROLE, 1, resolved=resolved,
                             model_path=str(reward_model_dir))
    try:
        group.call_all("init_model")
        stages = StepStages(resolved, actor=None, critic=None, rewards=None, decode=None, reward_model=group,
                            rm_inputs=switch)
        scores = stages.reward_model_scores(batch, CHATS)
    finally:
        group.kill()
    assert switch.take_metrics() == {"reward/rm_inputs_truncated": sum(n > max_length for n in lengths)}

    model = load_reward_model(reward_model_dir).eval()
    digits = {reward.convert_tokens_to_ids(token) for token in REWARD_TOKENS}
    direct, closed_form = [], []
    for chat, ids, mask in zip(CHATS, batch["responses"], batch["response_mask"], strict=True):
        response = policy.decode(ids[mask.bool()].tolist()).replace(policy.eos_token, "")
        text = reward.apply_chat_template([*chat, {"role": "assistant", "content": response}], tokenize=False)
        tokens = reward(text, add_special_tokens=False)["input_ids"][:max_length]
        with torch.no_grad():
            direct.append(float(model(input_ids=torch.tensor([tokens])).logits[0, -1, 0]))
        closed_form.append(tiny_reward_score(tokens, digits))
    torch.testing.assert_close(scores, torch.tensor(direct), rtol=0, atol=SCORE_ATOL)
    torch.testing.assert_close(scores, torch.tensor(closed_form), rtol=0, atol=SCORE_ATOL)
    assert len(set(closed_form)) == len(closed_form)  # the rows score apart: the test tells them apart


def test_a_training_step_re_renders_the_datasets_chats_for_the_reward_model(tmp_path: Path,
                                                                           monkeypatch: pytest.MonkeyPatch):
    """The chat messages travel from the parquet rows to the reward model: a step with input_tokenizer set scores
    every response, and with a max_length shorter than every rendering it says it cut them all."""
    from launching import compile_preset, train_in_process

    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("ppo_reward_model.yaml", ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
                                                        "reward_model.model.input_tokenizer=tiny://qwen2",
                                                        "reward_model.max_length=8"])
    metrics = train_in_process(resolved, tmp_path / "run").history[0]
    assert metrics["reward/rm_inputs_truncated"] == resolved.roles.rollout.sequences_per_step
    assert 0 <= metrics["reward/mean"] <= 1
