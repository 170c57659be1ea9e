"""bench/scaling.py's report on the CPU, from made-up launches: the quartile range of the ratios, the engine's
figures and the estimate ÷ peak per configuration (the launches themselves need GPUs)."""

from __future__ import annotations

import sys

import pytest
from bench_scripts import bench_module

torch = pytest.importorskip("torch")
scaling = bench_module("scaling")


def made_up(name, model, steps, strong, extra, timeout):
    gpus, tp = scaling.CONFIGS[name]
    prompts, step = 8 * gpus, (3.8 if gpus == 2 else 3.0)
    return {"gpus": gpus, "tp": tp, "prompts": prompts, "step_s": step, "step_s_quartiles": [step - 0.3, step + 0.2],
            "completion_tokens_per_s": prompts * 8 * 512 / step, "generate_tokens_per_s": 1.0,
            "medians": {"timing/generate": 2.0, "timing/update_actor": 0.5, "timing/weight_sync": 0.1,
                        "timing/rollout_engine_step_median": 0.0045, "timing/rollout_engine_gc": 0.25},
            "steps": 5, "learning": {"steps": [1, 2], "actor/ppo_kl": [0.0, 0.1]},
            "estimate_over_peak": {"training": 1.05, "rollout": 1.01}}


def test_the_report_gives_each_ratio_with_the_range_its_quartiles_allow(monkeypatch, capsys):
    monkeypatch.setattr(scaling, "run_config", made_up)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda index: "a made-up GPU")
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.delenv("OUT", raising=False)
    monkeypatch.setattr(sys, "argv", ["scaling.py", "--configs", "1gpu,2gpu_tp1"])
    scaling.main()
    out = capsys.readouterr().out
    # 16 prompts in 3.8 s against 8 in 3.0 s: 1.58; from 2 GPUs slow (4.0 s) and 1 fast (2.7 s) up to the reverse.
    assert "2gpu_tp1 / 1gpu completion tokens/s: 1.58 (quartile range 1.35–1.83)" in out
    assert "(2.70–3.20)" in out and "gc s 0.25" in out and "training 1.050  rollout 1.010" in out
