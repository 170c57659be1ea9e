"""bench/verl_side_by_side.py on the CPU: w1's and w2's plans stay the ones published, w3's and w4's compile to the
2-GPU plans they are meant to be and fit an H100 by rlconf's estimate, and a run watches every GPU of its workload."""

from __future__ import annotations

import json
import os
import re
import stat
import sys
import time
from pathlib import Path

import pytest
from bench_scripts import bench_module, fake_verl_site

from rlconf.compile import compile_plan
from rlconf.diagnostics import Severity

sbs = bench_module("verl_side_by_side")
DOCS = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"


def _published_w1() -> list[str]:
    """The SHARED block docs/benchmarks.md printed for the 2026-11-26 side by side (w1)."""
    text = DOCS.read_text()
    block = re.search(r"\*\*SHARED, the overrides both commands got\*\*.*?\n```\n(.*?)```", text, re.S)
    assert block, "docs/benchmarks.md no longer holds the published SHARED block"
    return block.group(1).split()


def test_w1_and_w2_are_the_plans_docs_benchmarks_published():
    published = [o.replace("$REPO/bench/verl_reward.py", str(sbs.REWARD_FILE)) for o in _published_w1()]
    assert sbs.shared_overrides("$MODEL", "$DATA", sbs.WORKLOADS["w1"], 5, "w1") == published
    # "w2 changes the two batch sizes to 32 and the name"
    w2 = [o.replace("batch_size=8", "batch_size=32").replace("experiment_name=w1", "experiment_name=w2")
          for o in published]
    assert sbs.shared_overrides("$MODEL", "$DATA", sbs.WORKLOADS["w2"], 5, "w2") == w2
    assert sbs.WORKLOADS["w1"].gpu_ids == sbs.WORKLOADS["w2"].gpu_ids == "0"


@pytest.mark.parametrize("side", ["rlconf", "rlconf_best"])
@pytest.mark.parametrize("name", ["w3", "w4"])
def test_two_gpu_workloads_compile_to_their_plan_and_fit_an_h100(tmp_path, name, side):
    workload = sbs.WORKLOADS[name]
    plan = tmp_path / "plan.yaml"
    plan.write_text("{}\n")
    shared = sbs.shared_overrides(workload.model, "/data", workload, 5, name)
    result = compile_plan(plan, sbs.side_overrides(side, shared) + [f"estimate.gpu_memory_gib={sbs.H100_GIB}"])
    errors = [d for d in result.diagnostics if d.severity == Severity.ERROR]
    assert result.resolved is not None and not errors, [d.message for d in errors]
    assert "RL609" not in {d.code for d in result.diagnostics}  # no phase over the GPU
    resolved = result.resolved
    assert resolved.world.world_size == workload.gpus == 2
    actor, rollout = resolved.roles.actor, resolved.roles.rollout
    assert (rollout.tensor_parallel_size, rollout.replicas) == (workload.rollout_tp, 2 // workload.rollout_tp)
    # weak scaling of w1: 8 prompts × 8 samples a GPU
    assert rollout.prompts_per_step == workload.prompts and actor.sequences_per_gpu == 8 * sbs.SAMPLES
    assert actor.optimizer_steps_per_train_step == 1
    assert actor.max_token_len_per_gpu == rollout.log_prob.max_token_len_per_gpu == workload.token_budget
    assert workload.token_budget % sbs.SEQUENCE_TOKENS == 0  # whole sequences a micro batch
    assert {m.phase for m in resolved.memory} == {"rollout", "training"}
    assert all(m.total_gib <= sbs.H100_GIB for m in resolved.memory), [(m.phase, m.total_gib) for m in resolved.memory]
    fsdp = resolved.config.actor_rollout_ref.actor.fsdp_config
    assert (fsdp.param_offload, fsdp.optimizer_offload) == ((True, True) if name == "w4" else (False, False))


@pytest.mark.parametrize("name", ["w1", "w2", "w3", "w4"])
def test_the_mp_side_runs_vllm_in_processes_of_its_own_where_a_replica_has_one_gpu(tmp_path, name):
    workload = sbs.WORKLOADS[name]
    plan = tmp_path / "plan.yaml"
    plan.write_text("{}\n")
    shared = sbs.shared_overrides(workload.model, "/data", workload, 5, name)
    result = compile_plan(plan, sbs.side_overrides("rlconf_mp", shared) + [f"estimate.gpu_memory_gib={sbs.H100_GIB}"])
    errors = [d.code for d in result.diagnostics if d.severity == Severity.ERROR]
    if workload.rollout_tp > 1:  # w4's rollout is tensor parallel over 2 GPUs: not a layout `mp` runs (RL372)
        assert errors == ["RL372"]
        return
    assert not errors and result.resolved is not None
    vllm = result.resolved.config.actor_rollout_ref.rollout.engine_kwargs.vllm
    assert vllm["distributed_executor_backend"] == "mp"


def test_a_side_named_again_runs_under_a_label_of_its_own_and_a_misspelt_one_is_refused(monkeypatch, capsys):
    assert sbs.side_labels(["rlconf", "rlconf_mp", "rlconf_mp", "rlconf"]) == [
        ("rlconf", "rlconf"), ("rlconf_mp", "rlconf_mp"), ("rlconf_mp", "rlconf_mp_r2"), ("rlconf", "rlconf_r2")]
    monkeypatch.setattr(sys, "argv", ["verl_side_by_side.py", "--workloads", "w1", "--sides", "rlconf,rlconf_mpp"])
    with pytest.raises(SystemExit):
        sbs.main()
    assert "--sides: rlconf_mpp unknown" in capsys.readouterr().err


def test_extra_overrides_join_every_sides_list_last():
    workload = sbs.WORKLOADS["w1"]
    extra = ["actor_rollout_ref.model.use_fused_kernels=true"]
    plain = sbs.shared_overrides("/m", "/data", workload, 5, "w1")
    shared = sbs.shared_overrides("/m", "/data", workload, 5, "w1", extra)
    assert shared == plain + extra
    for side in ("rlconf", "verl", "rlconf_best", "rlconf_mp"):
        assert sbs.side_overrides(side, shared)[:len(shared)] == shared


@pytest.mark.parametrize("name", sorted(sbs.WORKLOADS))
def test_each_workload_gets_the_random_twin_of_its_model_built_once_into_rlconfs_cache(tmp_path, monkeypatch, name):
    import engine.models.tiny as tiny
    from rlconf.modelinfo import RANDOM_PREFIX, RANDOM_TWINS

    model = sbs.WORKLOADS[name].model
    assert model.startswith(RANDOM_PREFIX) and model[len(RANDOM_PREFIX):] in RANDOM_TWINS
    monkeypatch.setenv("RLCONF_CACHE_DIR", str(tmp_path))
    built = []  # the builder itself is tests/engine/test_random_models.py's (shape and bf16); these take minutes
    monkeypatch.setattr(tiny, "build_random_model",
                        lambda twin, out, full_vocabulary=False: built.append((twin, out, full_vocabulary)) or Path(out))
    short = model[len(RANDOM_PREFIX):]
    assert sbs.prepare_model(model) == str(tmp_path / f"random-{short}-full-vocabulary")
    # every id a token: verl's rollout masks ids beyond the tokenizer, its trainer does not (prepare_model)
    assert built == [(short, tmp_path / f"random-{short}-full-vocabulary", True)]
    assert sbs.prepare_model(str(tmp_path / "some_dir")) == str(tmp_path / "some_dir") and len(built) == 1


def test_w4_without_its_offload_would_not_fit_and_check_says_so_through_the_cli():
    # The CLI path --check takes (rlconf explain -f json): w4 fits; its plan without the offload does not.
    w4 = sbs.WORKLOADS["w4"]
    shared = sbs.shared_overrides(w4.model, "/data", w4, 5, "w4")
    fit = sbs.rlconf_fit(shared)
    assert fit["exit"] == 0 and fit["fits"], fit
    assert set(fit["memory_gib"]) == {"global/rollout", "global/training"}
    unfit = sbs.rlconf_fit([o for o in shared if o not in sbs.OFFLOAD])
    assert not unfit["fits"] and any("RL609" in line for line in unfit["diagnostics"]), unfit
    assert max(unfit["memory_gib"].values()) > sbs.H100_GIB


# Stands in for nvidia-smi: GPUs 0 and 1 with the MiB in FAKE_SMI_MIB ("0:1000,1:3000"), `-i` picks some, `-lms`
# repeats the query every so many ms until killed.
FAKE_SMI = """#!{python}
import os, sys, time
used = dict(pair.split(":") for pair in os.environ["FAKE_SMI_MIB"].split(","))
args = sys.argv[1:]
gpus = next((a.split("=", 1)[1] if "=" in a else args[i + 1] for i, a in enumerate(args) if a.startswith("-i")), None)
gpus = gpus.split(",") if gpus else sorted(used)
fields = next(a for a in args if a.startswith("--query-gpu=")).split("=", 1)[1]
period = next((int(a.split("=", 1)[1]) for a in args if a.startswith("-lms=")), None)
while True:
    for gpu in gpus:
        print(", ".join({{"index": gpu, "memory.used": used[gpu], "name": "Fake"}}.get(f, "0")
                        for f in fields.split(",")), flush=True)
    if period is None:
        break
    time.sleep(period / 1000)
"""


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    smi = bin_dir / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(python=sys.executable))
    smi.chmod(smi.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_MIB", "0:512,1:1536")  # under wait_gpu_free's 2 GiB: no wait


def test_the_sampler_and_the_wait_read_every_gpu_they_are_given(fake_smi):
    sampler = sbs.GpuSampler(period_ms=20, gpus=sbs.WORKLOADS["w3"].gpu_ids)
    deadline = time.time() + 10
    while len(sampler.peaks_mib) < 2 and time.time() < deadline:
        time.sleep(0.05)
    assert sampler.stop() == 1.5  # the larger GPU's peak, GiB
    assert sampler.per_gpu_gib() == {0: 0.5, 1: 1.5}
    assert sbs.gpu_used_gib(sbs.WORKLOADS["w1"].gpu_ids) == 0.5  # GPU 0 only
    assert sbs.gpu_used_gib(sbs.WORKLOADS["w4"].gpu_ids) == 1.5
    # the wait is for every GPU: GPU 1 is over 1 GiB, so it waits out its timeout and says how much is in use
    assert sbs.wait_gpu_free(limit_gib=1.0, timeout=0, gpus="0") == 0.5
    assert sbs.wait_gpu_free(limit_gib=1.0, timeout=0, gpus="0,1") == 1.5


# Stands in for verl's main_ppo: says which GPUs it sees, prints verl's console step lines, then waits, as verl's
# shutdown might, until it is killed.
FAKE_VERL_MAIN = """
import os, time
print("visible:", os.environ.get("CUDA_VISIBLE_DEVICES"), flush=True)
time.sleep(0.6)  # a few of the sampler's looks
for step in (1, 2, 3):
    print(f"(TaskRunner pid=1) step:{step} - timing_s/gen:1.0 - timing_s/step:{9 + step}.0 - "
          f"response_length/mean:512.0", flush=True)
time.sleep(600)
"""


def test_a_two_gpu_workload_runs_on_both_gpus_and_is_watched_on_both(tmp_path, monkeypatch, fake_smi):
    monkeypatch.setattr(sbs, "cache_sizes", lambda: {})
    site, out = fake_verl_site(tmp_path, FAKE_VERL_MAIN)
    w3 = sbs.WORKLOADS["w3"]
    shared = sbs.shared_overrides("/models/m", "/data", w3, 3, "w3")
    run = sbs.run_one("w3", "verl", w3, shared, out, 120, str(site), steps=3, entry=("verl.fake_main", "", ""))
    assert "visible: 0,1" in (out / "w3_verl.log").read_text()
    assert run["device_peak_used_gib_per_gpu"] == {0: 0.5, 1: 1.5} and run["device_peak_used_gib"] == 1.5
    assert run["gpu_used_gib_after"] == 1.5
    assert run["stopped_after_last_step"] and not run["timed_out"] and run["wall_s"] < 60
    assert "trainer.n_gpus_per_node=2" in run["overrides"]
    summary = run["summary"]
    assert summary["step_s"] == 11.5  # median of steps 2 and 3
    assert summary["completion_tokens_per_s"] == pytest.approx(w3.prompts * sbs.SAMPLES * sbs.RESPONSE_TOKENS / 11.5)


def test_the_table_marks_a_side_that_reached_only_its_first_step():
    one = {"side": "verl", "steps": [{"timing_s/step": 52.3, "timing_s/gen": 46.1}]}
    three = {"side": "rlconf", "steps": [{"timing/step": s} for s in (17.0, 4.0, 4.2)]}
    for run in (one, three):
        run["summary"] = sbs.summarize(run, 8)
    text = sbs.table({"workloads": {"w1": {"verl": one, "rlconf": three}}})
    assert "| w1 | verl | 52.30 (step 1 only) |" in text and "| w1 | rlconf | 4.10 |" in text


@pytest.fixture
def sigterm_handler():
    """The script's SIGTERM handler for one test: the default handler and a clear STOP after it."""
    import signal

    previous = signal.getsignal(signal.SIGTERM)
    sbs.stop_on_sigterm()
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)
        sbs.STOP.clear()


def test_a_sigterm_mid_run_keeps_the_steps_its_log_holds_and_waits_for_nothing(tmp_path, monkeypatch, fake_smi,
                                                                                sigterm_handler):
    """2026-11-28: an outer `timeout` stopped the script during verl's w3 run, and its steps were lost (no results.json
    row, the log's last step still in a buffer). Now the signal kills the run, whose steps come back marked
    interrupted, and the log holds each line as soon as it is read (the signal is sent only once the log shows three
    steps: a block-buffered log would not, and the test would fail on `saw_three_steps`)."""
    import signal
    import threading

    monkeypatch.setattr(sbs, "cache_sizes", lambda: {})
    site, out = fake_verl_site(tmp_path, FAKE_VERL_MAIN)
    w3 = sbs.WORKLOADS["w3"]
    shared = sbs.shared_overrides("/models/m", "/data", w3, 5, "w3")
    log, done = out / "w3_verl.log", threading.Event()
    seen: list[bool] = []

    def term_once_three_steps_are_logged() -> None:
        deadline = time.time() + 30
        while not done.is_set() and time.time() < deadline:
            if log.is_file() and log.read_text().count("timing_s/step") >= 3:
                seen.append(True)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            time.sleep(0.05)

    watcher = threading.Thread(target=term_once_three_steps_are_logged, daemon=True)
    watcher.start()
    try:
        # five steps asked for, three printed: without the signal the run would wait out verl's "shutdown" (600 s)
        run = sbs.run_one("w3", "verl", w3, shared, out, 120, str(site), steps=5, entry=("verl.fake_main", "", ""))
    finally:
        done.set()
        watcher.join()
    assert seen == [True], "the log never showed three steps while the run went on"
    assert sbs.STOP.is_set() and run["interrupted"] and not run["stopped_after_last_step"] and run["wall_s"] < 60
    assert run["exit"] is not None and run["exit"] < 0  # killed, and reaped
    assert [step["timing_s/step"] for step in run["steps"]] == [10.0, 11.0, 12.0]
    assert run["gpu_used_gib_after"] is None  # no wait for the GPUs after an interruption
    assert run["summary"]["step_s"] == 11.5


def test_after_a_sigterm_no_run_starts_and_results_json_holds_the_ones_measured(tmp_path, monkeypatch, sigterm_handler):
    import argparse

    calls = []

    def fake_run_one(name, side, *args, **kwargs):
        calls.append(side)
        sbs.STOP.set()  # the signal arrives during the first run
        run = {"side": side, "exit": -9, "interrupted": True, "time_to_first_step_s": 1.0,
               "steps": [{"timing_s/step": 9.0}, {"timing_s/step": 4.0}]}
        return {**run, "summary": sbs.summarize(run, sbs.WORKLOADS[name].prompts)}

    monkeypatch.setattr(sbs, "run_one", fake_run_one)
    args = argparse.Namespace(sides="rlconf,verl", steps=3, overrides=[], budget_s=None, verl_ready=None,
                              run_timeout_s=100, verl_site="/nowhere")
    results = {"workloads": {}, "skipped": []}
    sbs.run_workloads(args, ["w3", "w4"], results, lambda model: ("/models/m", "/data"), tmp_path, time.perf_counter())
    assert calls == ["rlconf"] and list(results["workloads"]) == ["w3"]
    assert sbs.finish(results, tmp_path) == 143
    assert json.loads((tmp_path / "results.json").read_text())["workloads"]["w3"]["rlconf"]["interrupted"]


def test_a_run_and_the_wait_after_it_end_at_the_budget(tmp_path, monkeypatch, fake_smi):
    """Five steps asked of a run that prints three and then hangs, GPU 1 over the 2 GiB the wait wants: with 3 s of
    the budget left the run is stopped at it (not at its own 120 s limit) and no wait for the GPUs follows."""
    monkeypatch.setenv("FAKE_SMI_MIB", "0:512,1:4096")
    monkeypatch.setattr(sbs, "cache_sizes", lambda: {})
    site, out = fake_verl_site(tmp_path, FAKE_VERL_MAIN)
    w3 = sbs.WORKLOADS["w3"]
    shared = sbs.shared_overrides("/models/m", "/data", w3, 5, "w3")
    started = time.perf_counter()
    run = sbs.run_one("w3", "verl", w3, shared, out, 120, str(site), steps=5, entry=("verl.fake_main", "", ""),
                      deadline=time.perf_counter() + 3)
    assert run["timed_out"] and not run["interrupted"] and len(run["steps"]) == 3
    assert run["gpu_used_gib_after"] == 4.0  # looked at once, not waited on
    assert time.perf_counter() - started < 30
