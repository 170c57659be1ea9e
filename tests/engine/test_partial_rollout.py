"""Partial rollouts (async_training.partial_rollout): a response cut off by a weight push and finished after it.

The pure pieces by hand (engine.rollout.partial), then the real path on CPU: the rollout worker with HF generate
on the tiny model, cut off after a few tokens and finished with the cut rows' tokens as its prefix, gives the
response an uninterrupted generation gives (greedy, same weights), with the same rollout log-probs; and the fully
async stream (engine.controller.fully_async) interrupting, pushing and resuming a stand-in pool trains every group
once, each with the version it started under.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from engine.rollout.partial import continuation_prompts, join, unfinished  # noqa: E402

EOS, PAD = 1, 0


def test_a_row_is_unfinished_when_short_of_the_length_without_an_eos_among_its_tokens() -> None:
    responses = torch.tensor([[5, 6, 0, 0], [5, EOS, 0, 0], [5, 6, 7, 8], [0, 0, 0, 0], [5, 6, 7, 0]])
    generated = torch.tensor([2, 2, 4, 0, 2])  # the last row's third token is beyond its count: not seen
    assert unfinished(responses, generated, EOS, False, 4).tolist() == [True, False, False, True, True]
    # ignore_eos: only the length ends a row
    assert unfinished(responses, generated, EOS, True, 4).tolist() == [True, True, False, True, True]


def test_the_continuation_prompt_is_the_prompt_then_the_tokens_so_far_left_padded() -> None:
    prompts = {"input_ids": torch.tensor([[0, 3, 4], [7, 8, 9]]), "attention_mask": torch.tensor([[0, 1, 1], [1, 1, 1]])}
    responses = torch.tensor([[5, 6, 0], [5, 0, 0]])
    out = continuation_prompts(prompts, responses, torch.tensor([2, 0]), PAD)
    assert out["input_ids"].tolist() == [[3, 4, 5, 6], [0, 7, 8, 9]]
    assert out["attention_mask"].tolist() == [[1, 1, 1, 1], [0, 1, 1, 1]]


def test_join_keeps_each_rows_head_and_cuts_the_tail_at_the_length() -> None:
    head = torch.tensor([[1, 2, 0, 0], [3, 0, 0, 0]])
    tail = torch.tensor([[7, 8, 9], [4, 5, 6]])
    out, counts = join(head, torch.tensor([2, 1]), tail, torch.tensor([3, 2]), 4, PAD)
    assert out.tolist() == [[1, 2, 7, 8], [3, 4, 5, 0]] and counts.tolist() == [4, 3]
    lp, _ = join(head.float(), torch.tensor([2, 0]), tail.float(), torch.tensor([1, 3]), 4, 0.0)
    assert lp.tolist() == [[1.0, 2.0, 7.0, 0.0], [4.0, 5.0, 6.0, 0.0]]


class StopAfter:
    """Stands in for the worker's interrupt event: reports set from its `after`-th question on."""

    def __init__(self, after: int) -> None:
        self.after, self.asked = after, 0

    def is_set(self) -> bool:
        self.asked += 1
        return self.asked > self.after

    def clear(self) -> None:
        self.asked = -10**9


@pytest.fixture(scope="module")
def rollout_worker(tiny_model_dir):
    pytest.importorskip("transformers")
    from engine.workers.cluster.local import LocalWorkerGroup
    from engine.workers.roles.rollout import RolloutWorker
    from rlconf.compile import compile_plan

    result = compile_plan("presets/quickstart_fullasync.yaml", [
        "async_training.partial_rollout=true", f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.rollout.do_sample=false", "actor_rollout_ref.rollout.ignore_eos=true",
        "data.max_response_length=12"])
    assert result.resolved is not None, [d.message for d in result.errors]
    group = LocalWorkerGroup(RolloutWorker, "rollout", 1, resolved=result.resolved, model_path=str(tiny_model_dir),
                             pad_token_id=PAD, eos_token_id=EOS)
    group.call_all("init_model")
    yield group.worker
    group.kill()


def test_a_response_cut_off_and_finished_is_the_one_an_uninterrupted_generation_gives(rollout_worker) -> None:
    worker = rollout_worker
    length = worker.resolved.roles.rollout.response_length
    generator = torch.Generator().manual_seed(0)
    mask = torch.ones(4, 5, dtype=torch.long)
    mask[1::2, :2] = 0  # left padding on every other row
    prompts = {"input_ids": torch.randint(10, 200, (4, 5), generator=generator) * mask, "attention_mask": mask}
    whole = worker.generate(prompts)
    assert not whole["unfinished"].any() and whole["generated_tokens"].tolist() == [length] * 4

    worker._interrupted = StopAfter(4)  # asked once before generating, then after each token: the 4th stops it
    cut = worker.generate(prompts)
    assert cut["generated_tokens"].tolist() == [4] * 4 and cut["unfinished"].all()
    assert torch.equal(cut["rows"]["responses"][:, :4], whole["rows"]["responses"][:, :4])

    worker._interrupted = StopAfter(10**9)  # the new weights arrived (here: the same weights)
    rows = torch.tensor([0, 2, 3])  # what the controller sends back: the cut rows, their tokens as the prefix
    prefix = {"responses": cut["rows"]["responses"][rows], "rollout_log_probs": cut["rows"]["rollout_log_probs"][rows],
              "generated_tokens": cut["generated_tokens"][rows]}
    done = worker.generate({k: v[rows] for k, v in prompts.items()}, prefix)
    assert not done["unfinished"].any() and done["generated_tokens"].tolist() == [length] * 3
    for key in ("input_ids", "attention_mask", "position_ids", "responses", "response_mask"):
        assert torch.equal(done["rows"][key], whole["rows"][key][rows]), key
    assert torch.allclose(done["rows"]["rollout_log_probs"], whole["rows"]["rollout_log_probs"][rows], atol=1e-5)

    worker._interrupted = StopAfter(0)  # a call that starts after the interrupt samples nothing
    idle = worker.generate(prompts)
    assert idle["generated_tokens"].tolist() == [0] * 4 and idle["unfinished"].all()
    import threading

    worker._interrupted = threading.Event()
    assert worker.interrupt() is True and worker._interrupted.is_set()


def test_without_log_probs_a_cut_response_resumes_to_the_same_tokens(rollout_worker, tiny_model_dir,
                                                                     monkeypatch) -> None:
    """rollout.calculate_log_probs false: the rows and the prefix sent back carry no log-probs, and the resumed
    responses are those of an uninterrupted call."""
    import threading

    from rlconf.compile import compile_plan

    worker = rollout_worker
    resolved = compile_plan("presets/quickstart_fullasync.yaml", [
        "async_training.partial_rollout=true", f"actor_rollout_ref.model.path={tiny_model_dir}",
        "actor_rollout_ref.rollout.do_sample=false", "actor_rollout_ref.rollout.ignore_eos=true",
        "data.max_response_length=12", "actor_rollout_ref.rollout.calculate_log_probs=false",
        "algorithm.rollout_correction.bypass_mode=false"]).resolved  # the preset's bypass mode reads them
    assert resolved is not None and not resolved.roles.rollout.log_probs
    monkeypatch.setattr(worker, "resolved", resolved)
    monkeypatch.setattr(worker, "_interrupted", threading.Event())
    prompts = {"input_ids": torch.randint(10, 200, (2, 5), generator=torch.Generator().manual_seed(1)),
               "attention_mask": torch.ones(2, 5, dtype=torch.long)}
    whole = worker.generate(prompts)
    worker._interrupted = StopAfter(3)
    cut = worker.generate(prompts)
    assert "rollout_log_probs" not in whole["rows"] and "rollout_log_probs" not in cut["rows"]
    worker._interrupted = StopAfter(10**9)
    prefix = {"responses": cut["rows"]["responses"], "generated_tokens": cut["generated_tokens"]}
    done = worker.generate(prompts, prefix)
    assert "rollout_log_probs" not in done["rows"]
    assert torch.equal(done["rows"]["responses"], whole["rows"]["responses"])


def test_a_streamed_call_answers_a_window_of_groups_at_a_time_with_a_plain_calls_rows(rollout_worker,
                                                                                     monkeypatch) -> None:
    """RolloutWorker.generate_streamed on HF generate (no continuous batching: a window of groups a batch, each
    batch's groups answered when it ends), greedy: the rows a plain call gives, a window at a time, then the call's
    account; interrupted before it began, every group answered with nothing sampled, to be resumed."""
    import threading

    from engine.batch import concat

    worker = rollout_worker
    n = worker.resolved.roles.rollout.n
    monkeypatch.setattr(worker, "_interrupted", threading.Event())
    generator = torch.Generator().manual_seed(1)
    prompts = {"input_ids": torch.randint(10, 200, (3, 5), generator=generator).repeat_interleave(n, dim=0),
               "attention_mask": torch.ones(3 * n, 5, dtype=torch.long)}  # three groups of n rows
    whole = worker.generate(prompts)
    *answers, account = worker.generate_streamed(prompts, 2)
    assert [a["groups"] for a in answers] == [[0, 1], [2]] and account["done"] and "backend" in account
    streamed = concat([a["rows"] for a in answers])
    for key in ("input_ids", "responses", "response_mask"):
        assert torch.equal(streamed[key], whole["rows"][key]), key
    assert not any(bool(a["unfinished"].any()) for a in answers)
    assert answers[0]["generate_seconds"] > 0 and answers[1]["idle_seconds"] == 0.0
    worker._interrupted.set()
    *cut, _ = worker.generate_streamed(prompts, 2)
    assert [a["groups"] for a in cut] == [[0, 1], [2]]
    assert all(a["generated_tokens"].sum() == 0 and bool(a["unfinished"].all()) for a in cut)


def test_a_row_the_backend_says_ended_is_not_resumed_even_without_an_eos_among_its_tokens(rollout_worker,
                                                                                        monkeypatch) -> None:
    """vLLM reports which requests ended (engine.rollout.vllm: `ended`); the worker believes it over the tokens."""
    import threading

    from engine.rollout.base import assemble_rows

    worker = rollout_worker
    length = worker.resolved.roles.rollout.response_length

    def backend_generate(prompts, sampling, stop=None, row_limits=None):
        rows = assemble_rows(prompts, torch.full((2, sampling.max_new_tokens), 7), EOS, True,
                             rollout_log_probs=torch.zeros(2, sampling.max_new_tokens))
        return {**rows, "generated_tokens": torch.tensor([3, 3]), "ended": torch.tensor([True, False])}

    monkeypatch.setattr(worker.backend, "generate", backend_generate)
    monkeypatch.setattr(worker, "_interrupted", threading.Event())  # not interrupted (an earlier test set its own)
    prompts = {"input_ids": torch.full((2, 3), 20), "attention_mask": torch.ones(2, 3, dtype=torch.long)}
    answer = worker.generate(prompts)
    assert answer["generated_tokens"].tolist() == [3, 3] and 3 < length
    assert answer["unfinished"].tolist() == [False, True]


class CutAtPushGroup:
    """A stand-in rollout worker group of one rank: a call runs when its answer is collected, unless the controller
    interrupted it first, which cuts it after 2 tokens. Token values tell which weights sampled them: 100 + version.
    A streamed call (the fully async schedule's fresh groups) answers one whole group each time it is read, and once
    interrupted, every group it has left in one answer, cut after 2 tokens; then its account."""

    world_size = 1

    def __init__(self, length: int, n: int = 8) -> None:
        self.length, self.version, self.n = length, 0, n
        self.pending: dict[int, tuple] = {}
        self.cut: dict[int, dict] = {}
        self.streams: dict[int, dict] = {}
        self.refs = 0
        self.signals = 0  # interrupts received

    def submit_streamed(self, method: str, shards: list, window: int) -> list[int]:
        assert method == "generate_streamed"
        self.refs += 1
        self.streams[self.refs] = {"prompts": shards[0], "version": self.version, "next": 0, "cut": False,
                                   "left": len(shards[0]["input_ids"]) // self.n, "ended": False}
        return [self.refs]

    def first_ready(self, streams: list) -> int:
        return 0

    def next_from(self, rank: int, ref: int) -> dict:
        stream = self.streams[ref]
        if stream["ended"]:
            raise StopIteration
        first, groups = stream["next"], len(stream["prompts"]["input_ids"]) // self.n
        if first == groups:
            stream["ended"] = True
            return {"done": True, "version": stream["version"],
                    "backend": {"generate_in_worker": 0.5, "device_used_gb": float(stream["version"])}}
        last = groups if stream["cut"] else first + 1
        stream["next"] = last
        prompts = {key: value[first * self.n:last * self.n] for key, value in stream["prompts"].items()}
        answer = self._answer(prompts, None, stream["version"], tokens=2 if stream["cut"] else self.length)
        answer.pop("backend")
        return {**answer, "groups": list(range(first, last))}

    def submit_sharded(self, method: str, shards: list) -> list[int]:
        return self.submit_to(0, method, shards[0])

    def submit_to(self, rank: int, method: str, prompts: dict, prefix: dict | None = None) -> list[int]:
        self.refs += 1
        self.pending[self.refs] = (prompts, prefix, self.version)
        return [self.refs]

    def signal_all(self, method: str) -> list[bool]:
        assert method == "interrupt"
        self.signals += 1
        for stream in self.streams.values():
            stream["cut"] = True
        self.cut.update({ref: self._answer(*call, tokens=2) for ref, call in self.pending.items()})
        self.pending.clear()
        return [True]

    def collect(self, refs: list[int]) -> list[dict]:
        return [self.cut.pop(ref) if ref in self.cut else self._answer(*self.pending.pop(ref), tokens=self.length)
                for ref in refs]

    def _answer(self, prompts: dict, prefix: dict | None, version: int, tokens: int) -> dict:
        rows = len(prompts["input_ids"])
        if prefix is None:
            prefix = {"responses": torch.zeros((rows, self.length), dtype=torch.long),
                      "generated_tokens": torch.zeros(rows, dtype=torch.long)}
        new = torch.full((rows, tokens), 100 + version)
        responses, counts = join(prefix["responses"], prefix["generated_tokens"], new, torch.full((rows,), tokens),
                                 self.length, PAD)
        return {"rows": {"input_ids": prompts["input_ids"], "responses": responses,
                         "rollout_log_probs": responses.float()},
                "version": version, "generate_seconds": 0.01, "idle_seconds": 0.0,
                "backend": {"generate_in_worker": 0.5, "device_used_gb": float(version)},
                "generated_tokens": counts, "unfinished": counts < self.length}


def pool(resolved, group: CutAtPushGroup):
    """The real StreamingPool (stream, interrupt, resume) over the stand-in group; its push only sets the version."""
    from engine.controller.fully_async import StreamingPool

    class Pool(StreamingPool):
        def push(self, actor: object, version: int) -> float:
            self.group.version = self.version = version
            return 0.0

    class NoBalancing:
        def balanced_order(self, prompts: dict, parts: int) -> None:
            return None

    return Pool(resolved, group, NoBalancing())


def test_the_stream_interrupts_at_each_push_and_trains_every_group_once_finished_within_the_bound() -> None:
    from test_fully_async import _draw, _resolved

    from engine.controller.fully_async import GroupStream, backend_per_rank, staleness_metrics
    from engine.controller.offpolicy import Resumed
    from engine.controller.stages import rollout_backend_metrics

    resolved = _resolved(partial_rollout="true", staleness_threshold=1.0, trigger_parameter_sync_step=1)
    sched = resolved.schedule
    assert sched.partial_rollout and sched.max_staleness == 1
    length, steps = 6, 8
    group = CutAtPushGroup(length)
    stream = GroupStream(resolved, pool(resolved, group), _draw(sched.groups_per_step), steps)
    trained, resumed, pushes, backend_seconds = [], 0, 0, 0.0
    for step in range(1, steps + 1):  # the order of engine.trainer.Trainer._fully_async_step
        version = stream.sync_due(step)
        if version is not None:
            stream.drain()  # the trainer times the wait apart from the push, which then drains no more
            stream.push(None, version)
            pushes += 1
            assert group.signals == pushes
        if step == steps // 2:  # a checkpoint just after a push saves the rows it cut, finished first
            assert any(isinstance(item, Resumed) for item in stream.queue._items)
            saved = stream.file_state()["batches"]
            assert saved and all(bool((batch["rows"]["responses"] != PAD).all()) for batch in saved)
        stream.refill()
        taken = stream.take(step)
        stream.refill()
        metrics = staleness_metrics(step, taken, stream)
        resumed += metrics["offpolicy/resumed_samples"]
        # the backend's seconds of each call (0.5 s) come once: a streamed call's with its last group, a resumed
        # call's with the groups it finished
        engine = rollout_backend_metrics(backend_per_rank(taken))
        backend_seconds += engine.get("timing/rollout_generate_in_worker", 0.0)
        with_backend = [v for g in taken if g.backend for v in (g.version, g.newest_version)]
        # the memory figure is the largest of the calls whose timings the step carries (the stand-in's: their version)
        assert engine.get("memory/rollout_device_used_gb") == (max(with_backend) if with_backend else None)
        assert metrics["offpolicy/staleness_max"] <= sched.max_staleness
        for g in taken:
            versions = g.rows["responses"] - 100
            assert g.generated_tokens.tolist() == [length] * len(versions) and not g.unfinished.any()
            # each response: the weights it started on, then (cut at a push) newer ones, never older, none after
            # the weights this step trains
            assert (versions[:, 0] == g.version).all() and (versions.diff(dim=1) >= 0).all()
            assert int(versions.max()) == g.newest_version <= step - 1
            trained += list(dict.fromkeys(g.samples.group_ids))
    assert trained == list(range(sched.groups_per_step, sched.groups_per_step * (steps + 1)))  # each once, in order
    assert resumed > 0 and stream.dropped == 0
    assert backend_seconds == 0.5 * group.refs  # every call the pool ran, streamed or resumed, counted once


def test_the_vllm_engine_interrupt_aborts_running_requests_keeping_what_they_sampled() -> None:
    """engine.rollout.vllm.EngineInterrupt inside the step clock, on a stand-in for vLLM 0.25's LLMEngine (the
    attributes it reads: output_processor.request_states, each state's detokenizer and logprobs processor), driven
    as vLLM's LLM._run_engine drives it. The real engine is a GPU run."""
    from types import SimpleNamespace

    from engine.rollout.vllm import EngineInterrupt, EngineStepClock

    class Engine:
        def __init__(self) -> None:
            flat = lambda: SimpleNamespace(logprobs=[], start_indices=[])  # noqa: E731
            self.output_processor = SimpleNamespace(request_states={
                f"internal-{i}": SimpleNamespace(external_req_id=str(i), detokenizer=SimpleNamespace(output_token_ids=[]),
                                                 logprobs_processor=SimpleNamespace(logprobs=flat()))
                for i in (7, 8)})
            self.steps, self.aborted = 0, []

        def has_unfinished_requests(self) -> bool:
            return bool(self.output_processor.request_states)

        def step(self) -> list:
            self.steps += 1
            for i, state in enumerate(self.output_processor.request_states.values()):
                state.detokenizer.output_token_ids.append(10 * self.steps + i)
                flat = state.logprobs_processor.logprobs
                flat.start_indices.append(len(flat.logprobs))
                flat.logprobs.append(-0.5 * self.steps)
            return []

        def abort_request(self, ids: list[str]) -> None:
            self.aborted += ids
            self.output_processor.request_states.clear()

    engine = Engine()
    with EngineStepClock(engine) as clock, EngineInterrupt(engine, lambda: engine.steps >= 2) as interrupt:
        while engine.has_unfinished_requests():
            engine.step()
    # two engine steps ran (timed), the third call found the stop and aborted both requests
    assert engine.steps == 2 and sorted(engine.aborted) == ["7", "8"] and len(clock.seconds) == 2
    assert interrupt.partial == {"7": ([10, 20], [-0.5, -1.0]), "8": ([11, 21], [-0.5, -1.0])}
    assert "step" not in vars(engine)  # both wrappers gone: the class's own step again


def test_the_vllm_rollout_gives_each_resumed_row_its_own_token_limit() -> None:
    """VLLMRollout._params with row limits: one SamplingParams per row, max_tokens its own limit, rows of the same
    limit sharing one object (the rest of the sampling unchanged). The path vLLM's partial rollouts take; the first
    GPU run found it broken (a missing import) where no CPU test had called it."""
    from engine.rollout.base import Sampling
    from engine.rollout.vllm import VLLMRollout

    rollout = object.__new__(VLLMRollout)  # no engine: only the sampling parameters are built
    rollout._sampling_params_cls, rollout.eos_token_id = dict, 2
    sampling = Sampling(max_new_tokens=16, temperature=0.7, top_p=0.9, top_k=-1, greedy=False, ignore_eos=False)
    assert rollout._params(sampling, None)["max_tokens"] == 16
    params = rollout._params(sampling, torch.tensor([16, 5, 5, 1]))
    assert [p["max_tokens"] for p in params] == [16, 5, 5, 1]
    assert params[1] is params[2] and params[0] is not params[1]
    assert all(p["temperature"] == 0.7 and p["stop_token_ids"] == [2] for p in params)


def test_a_run_resumed_from_a_checkpoint_with_partial_rollouts_neither_loses_nor_repeats_a_group(tmp_path) -> None:
    """The trainer's checkpoint of the stream (its counters and file_state, through torch.save and a weights-only
    load), taken at the end of a step whose push cut responses; a new stream and pool load it and go on."""
    from test_fully_async import _draw, _resolved

    from engine.controller.fully_async import GroupStream

    resolved = _resolved(partial_rollout="true", staleness_threshold=1.0, trigger_parameter_sync_step=1)
    per_step, steps, stop_after = resolved.schedule.groups_per_step, 8, 4

    def new_stream() -> GroupStream:
        return GroupStream(resolved, pool(resolved, CutAtPushGroup(6)), _draw(per_step), steps)

    def run(stream: GroupStream, first: int, last: int) -> list[int]:
        trained = []
        for step in range(first, last + 1):
            version = stream.sync_due(step)
            if version is not None:
                stream.push(None, version)
            stream.refill()
            taken = stream.take(step)
            stream.refill()
            assert all(int(g.generated_tokens.min()) == 6 for g in taken if g.generated_tokens is not None)
            trained += [i for g in taken for i in dict.fromkeys(g.samples.group_ids)]
        return trained

    whole = run(new_stream(), 1, steps)
    before = new_stream()
    first_part = run(before, 1, stop_after)
    counters = before.counters()
    torch.save(before.file_state(), tmp_path / "pending.pt")
    after = new_stream()
    after.load(counters, torch.load(tmp_path / "pending.pt", weights_only=True))
    assert first_part + run(after, stop_after + 1, steps) == whole == list(range(per_step, per_step * (steps + 1)))


def test_a_sample_cut_at_two_pushes_counts_once_among_the_resumed() -> None:
    """With a bound of 3 steps and a push every step, calls still queued at the next push are cut again: each
    sample counts once in offpolicy/resumed_samples (a per-row flag, not a count added at every cut)."""
    from test_fully_async import _draw, _resolved

    from engine.controller.fully_async import GroupStream, staleness_metrics

    resolved = _resolved(partial_rollout="true", staleness_threshold=3.0, trigger_parameter_sync_step=1)
    sched = resolved.schedule
    stream = GroupStream(resolved, pool(resolved, CutAtPushGroup(6)), _draw(sched.groups_per_step), 8)
    cut_twice = 0
    for step in range(1, 9):
        version = stream.sync_due(step)
        if version is not None:
            stream.drain()
            stream.push(None, version)
        stream.refill()
        taken = stream.take(step)
        stream.refill()
        metrics = staleness_metrics(step, taken, stream)
        assert metrics["offpolicy/resumed_samples"] <= sum(len(g.samples.group_ids) for g in taken)
        for g in taken:
            versions = g.rows["responses"] - 100
            cut_twice += int(((versions.diff(dim=1) > 0).sum(dim=1) >= 2).sum())  # two version changes: two cuts
    assert cut_twice > 0  # the case this test is about happened


def test_a_validations_backend_seconds_reach_no_training_calls_figures(rollout_worker, monkeypatch) -> None:
    """vLLM's backend adds up its seconds until asked (engine.rollout.vllm: _add_seconds): the validation's own
    generation must not land in the next training call's figures, and what was timed before it (a weight load)
    must still reach them. The backend here sums as vLLM's does, one second a generate call."""
    import threading

    from test_validation_timings import summing_as_vllm

    worker = rollout_worker
    seconds = summing_as_vllm(worker.backend, monkeypatch)
    monkeypatch.setattr(worker, "_interrupted", threading.Event())
    prompts = {"input_ids": torch.full((2, 3), 20), "attention_mask": torch.ones(2, 3, dtype=torch.long)}
    worker.generate(prompts)  # whatever came before
    seconds["load_weights"] = 0.5  # a push the pool took before validating
    worker.generate_for_validation(prompts)
    answer = worker.generate(prompts)
    assert answer["backend"] == {"load_weights": 0.5, "generate_in_worker": 1.0}
    assert worker.generate(prompts)["backend"] == {"generate_in_worker": 1.0}  # carried once
