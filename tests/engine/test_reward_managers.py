"""verl's reward managers (reward_model.reward_manager): naive, dapo, batch and prime, on the CPU.

Each is checked against what verl's manager of the same name does with the scorer: how it is called
(per response by keyword, per batch, per response positionally in a process pool), and what the reward
is. prime must survive a scorer that hangs, raises or kills its process: those responses get verl's
fallback score within the timeout, the others their own scores, and the metrics count them.
"""

from __future__ import annotations

import textwrap
import time
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

SCORER = textwrap.dedent('''
    import os
    import time

    CALLS = []

    def by_length(data_source, solution_str, ground_truth, extra_info=None):
        CALLS.append(solution_str)
        if solution_str == "hang":
            time.sleep(10**6)
        if solution_str == "raise":
            raise ValueError("a broken scorer")
        if solution_str == "exit":
            os._exit(3)
        if solution_str == "dict":
            return {"score": 0.25, "acc": True}
        return float(len(solution_str)) + (100.0 if ground_truth == solution_str else 0.0)

    def whole_batch(data_sources, solution_strs, ground_truths, extra_infos):
        CALLS.append(list(solution_strs))
        # a group-level rule: each response's rank by length within the batch
        order = sorted(range(len(solution_strs)), key=lambda i: len(solution_strs[i]))
        return [{"score": float(order.index(i))} for i in range(len(solution_strs))]

    def short_batch(data_sources, solution_strs, ground_truths, extra_infos):
        return [1.0]
''')


@pytest.fixture()
def scorer_file(tmp_path: Path) -> Path:
    path = tmp_path / "scorer.py"
    path.write_text(SCORER)
    return path


def manager(scorer_file: Path, name: str, function: str, **kwargs):
    from engine.rewards.managers import build_reward_manager
    from rlconf.schema.sections import CustomRewardFunction, RewardModelConfig

    config = RewardModelConfig(reward_manager=name, **kwargs)
    built = build_reward_manager(config, CustomRewardFunction(path=str(scorer_file), name=function), log=lambda _: None)
    return built


def responses(texts: list[str], truths: list[str] | None = None, lengths: list[int] | None = None):
    from engine.rewards.managers import Responses

    return Responses(texts, ["custom"] * len(texts), truths or ["-"] * len(texts), [{} for _ in texts],
                     torch.tensor(lengths or [len(t) for t in texts]))


def test_naive_calls_the_scorer_once_per_response_by_keyword(scorer_file):
    rewards = manager(scorer_file, "naive", "by_length")
    scores, reward = rewards(responses(["ab", "abc", "dict"], truths=["ab", "x", "x"]))
    assert scores == [102.0, 3.0, 0.25]  # a dict result gives its "score", as verl reads it
    assert reward.tolist() == scores
    assert rewards.score_fn.__globals__["CALLS"] == ["ab", "abc", "dict"]
    assert rewards.take_metrics() == {}


def test_dapo_adds_the_overlong_penalty_to_the_reward_but_not_to_the_score(scorer_file):
    from rlconf.schema.sections import RewardKwargs

    kwargs = RewardKwargs(max_resp_len=4, overlong_buffer_cfg={"enable": True, "len": 2, "penalty_factor": 1.0})
    rewards = manager(scorer_file, "dapo", "by_length", reward_kwargs=kwargs)
    scores, reward = rewards(responses(["a", "abc", "abcd"], lengths=[1, 3, 4]))
    assert scores == [1.0, 3.0, 4.0]
    # expected length 4 - 2 = 2: the penalty is min(-(L - 2) / 2, 0)
    assert reward.tolist() == pytest.approx([1.0, 3.0 - 0.5, 4.0 - 1.0])


def test_batch_hands_the_scorer_the_whole_batch_at_once(scorer_file):
    rewards = manager(scorer_file, "batch", "whole_batch")
    scores, reward = rewards(responses(["ccc", "a", "bb"]))
    assert rewards.score_fn.__globals__["CALLS"] == [["ccc", "a", "bb"]]  # one call, every response
    assert scores == [2.0, 0.0, 1.0]
    assert reward.tolist() == scores


def test_batch_refuses_a_scorer_that_returns_too_few_scores(scorer_file):
    rewards = manager(scorer_file, "batch", "short_batch")
    with pytest.raises(ValueError, match="returned 1 scores for 3 responses"):
        rewards(responses(["a", "b", "c"]))


def test_prime_scores_in_processes_as_the_naive_manager_does(scorer_file):
    prime = manager(scorer_file, "prime", "by_length")
    naive = manager(scorer_file, "naive", "by_length")
    batch = responses(["ab", "abc", "dict", "x" * 7], truths=["ab", "-", "-", "-"])
    assert prime(batch)[0] == naive(batch)[0] == [102.0, 3.0, 0.25, 7.0]
    assert prime.score_fn.__globals__["CALLS"] == []  # the scorer ran in the pool's processes, not here
    assert prime.take_metrics() == {"reward/scorer_timeouts": 0, "reward/scorer_errors": 0}


def test_prime_gives_a_hung_a_raising_and_a_dying_scorer_the_fallback_within_the_timeout(scorer_file):
    from engine.rewards.managers import PRIME_FALLBACK_SCORE

    timeout = 3.0
    prime = manager(scorer_file, "prime", "by_length")
    prime.prime_timeout_s = timeout
    prime.prime_processes = 3  # fewer processes than responses: the pool hands out items as workers free up
    texts = ["hang", "ab", "raise", "abcd", "exit", "abc"]
    started = time.monotonic()
    scores, reward = prime(responses(texts))
    elapsed = time.monotonic() - started
    assert elapsed < timeout + 2.0, f"prime took {elapsed:.1f} s with a {timeout} s timeout"
    fallback = PRIME_FALLBACK_SCORE
    assert scores == [fallback, 2.0, fallback, 4.0, fallback, 3.0]
    assert reward.tolist() == scores
    assert prime.take_metrics() == {"reward/scorer_timeouts": 1, "reward/scorer_errors": 2}
    assert prime.take_metrics() == {}  # counted once


def test_only_verls_four_managers_run():
    from engine.rewards.managers import RewardManager
    from rlconf.schema.sections import RewardModelConfig

    with pytest.raises(ValueError, match="runs naive, dapo, batch, prime"):
        RewardManager("gdpo", lambda **_: 0.0, RewardModelConfig(reward_manager="gdpo"))


def test_a_training_step_under_prime_scores_in_the_pool_and_counts_the_failures(tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch):
    import os

    from launching import compile_preset, train_in_process

    # Full credit only when scored in a process other than this one (the pool's), and an error for every response
    # of odd length: the step's reward and its error count must add up to the batch.
    scorer = tmp_path / "pool_scorer.py"
    scorer.write_text(textwrap.dedent(f'''
        import os

        def compute_score(data_source, solution_str, ground_truth, extra_info=None):
            if len(solution_str) % 2:
                raise ValueError("odd")
            return 1.0 if os.getpid() != {os.getpid()} else -1.0
    '''))
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path / "cache"))
    resolved = compile_preset("quickstart.yaml", ["trainer.n_gpus_per_node=1", "trainer.total_training_steps=1",
                                                  "reward_model.reward_manager=prime",
                                                  f"custom_reward_function.path={scorer}"])
    assert resolved.reward.manager == "prime" and "prime manager" in resolved.reward.text
    metrics = train_in_process(resolved, tmp_path / "run").history[0]
    sequences = resolved.roles.rollout.sequences_per_step
    assert metrics["reward/scorer_timeouts"] == 0
    assert metrics["reward/mean"] >= 0  # no response was scored in the controller's own process
    assert metrics["reward/mean"] * sequences + metrics["reward/scorer_errors"] == pytest.approx(sequences)
