"""HF `generate` on a plain (unsharded) copy of the actor: the backend that runs anywhere, CPU included.

It returns the log-probs of the sampled tokens under the distribution it sampled from (after
temperature, top-k and top-p), as vLLM does, so rollout correction and bypass mode run here too:
the warpers are passed as our own processors with a recorder last (HF runs its own warpers after
any passed processor, where a recorder could not see them).

After each update the FSDP shards are gathered into the copy (engine.workers.fsdp.gather, bucket by bucket). Generating on
the FSDP module itself would need every rank to run the same number of decode steps (each forward
is a collective), while a local copy lets each rank stop at its own EOS.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable, Iterable
from typing import Any

import torch
from transformers import (LogitsProcessor, LogitsProcessorList, StoppingCriteria, StoppingCriteriaList,
                          TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper)

from engine.rollout.base import Sampling, assemble_rows
from engine.batch import TensorBatch


class HFRollout:
    name = "hf"

    def __init__(self, model: torch.nn.Module, device: torch.device, dtype: torch.dtype, pad_token_id: int,
                 eos_token_id: int) -> None:
        """`model`: the actor before sharding, on the CPU. Copied there and cast on the way to the
        device, so the device never holds a second fp32 model."""
        self.model = copy.deepcopy(model).to(device, dtype).eval()
        self.device, self.pad_token_id, self.eos_token_id = device, pad_token_id, eos_token_id
        self._seconds: dict[str, float] = {}

    @torch.no_grad()
    def generate(self, prompts: TensorBatch, sampling: Sampling, stop: Callable[[], bool] | None = None,
                 row_limits: torch.Tensor | None = None) -> TensorBatch:
        """`stop` (partial rollouts): checked after every token; once true, every row ends where it is, and the rows
        say how many tokens each has (`generated_tokens`, engine.rollout.partial). `row_limits`: HF generates every
        row to sampling.max_new_tokens; the caller cuts each row at its own limit (engine.rollout.partial.join)."""
        started = time.perf_counter()
        recorder = SampledLogProbs() if sampling.log_probs else None
        # HF's own warpers stay off (temperature 1, top_k 0, top_p 1); ours run in HF's order, then the recorder.
        processors: list[LogitsProcessor] = []
        if not sampling.greedy:
            if sampling.temperature != 1.0:
                processors.append(TemperatureLogitsWarper(sampling.temperature))
            if sampling.top_k > 0:
                processors.append(TopKLogitsWarper(sampling.top_k))
            if sampling.top_p < 1.0:
                processors.append(TopPLogitsWarper(sampling.top_p))
        kwargs: dict[str, Any] = dict(do_sample=not sampling.greedy, max_new_tokens=sampling.max_new_tokens,
                                      pad_token_id=self.pad_token_id, eos_token_id=self.eos_token_id,
                                      logits_processor=LogitsProcessorList([*processors, *filter(None, [recorder])]))
        if not sampling.greedy:
            kwargs.update(temperature=1.0, top_k=0, top_p=1.0)
        if sampling.ignore_eos:
            kwargs.update(min_new_tokens=sampling.max_new_tokens)
        if stop is not None:
            kwargs["stopping_criteria"] = StoppingCriteriaList([StopWhen(stop)])
        input_ids = prompts["input_ids"].to(self.device)
        output = self.model.generate(input_ids=input_ids, attention_mask=prompts["attention_mask"].to(self.device),
                                     **kwargs)
        responses = torch.full((output.shape[0], sampling.max_new_tokens), self.pad_token_id, dtype=torch.long)
        generated = output[:, input_ids.shape[1]:].cpu()
        responses[:, :generated.shape[1]] = generated
        log_probs = None
        if recorder is not None:
            log_probs = torch.zeros(responses.shape, dtype=torch.float32)
            picked = recorder.finish(output[:, -1]).cpu()
            log_probs[:, :picked.shape[1]] = picked
        rows = assemble_rows(prompts, responses, self.eos_token_id, sampling.ignore_eos, rollout_log_probs=log_probs)
        if stop is not None:  # HF pads the rows that ended: every row ran the same number of steps
            rows["generated_tokens"] = torch.full((output.shape[0],), generated.shape[1], dtype=torch.long)
        self._seconds["generate_in_worker"] = time.perf_counter() - started
        return rows

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        target = self.model.state_dict()
        loaded: set[int] = set()
        for name, tensor in named_tensors:
            if name not in target:
                raise KeyError(f"the HF rollout copy has no tensor {name!r}")
            target[name].copy_(tensor)  # casts to the copy's dtype
            loaded.add(target[name].data_ptr())
        # A tied tensor (lm_head = embed_tokens) arrives once and fills both names.
        missing = sorted(name for name, t in target.items() if t.data_ptr() not in loaded)
        if missing:
            raise KeyError(f"the actor sent no value for {len(missing)} tensors of the rollout copy, e.g. {missing[:3]}")

    def release(self) -> None:
        pass  # the copy is small next to the actor's fp32 states, and rebuilding it would cost a copy

    def timings(self) -> dict[str, float]:
        out, self._seconds = self._seconds, {}
        return out

    def num_params(self) -> int:
        return sum(p.numel() for p in self.model.parameters())


class StopWhen(StoppingCriteria):
    """Ends every row once `stop()` is true (a weight push interrupts the call: partial rollouts)."""

    def __init__(self, stop: Callable[[], bool]) -> None:
        self.stop = stop

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor, **kwargs: Any) -> torch.BoolTensor:
        return torch.full((input_ids.shape[0],), self.stop(), dtype=torch.bool, device=input_ids.device)


class SampledLogProbs(LogitsProcessor):
    """The last processor: log-softmax of the scores a step samples from; the sampled token's entry is
    picked at the next step, when it is the last column of `input_ids` (and by `finish` for the last)."""

    def __init__(self) -> None:
        self.previous: torch.Tensor | None = None
        self.picked: list[torch.Tensor] = []

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        if self.previous is not None:
            self._pick(input_ids[:, -1])
        self.previous = torch.log_softmax(scores.float(), dim=-1)
        return scores

    def _pick(self, tokens: torch.Tensor) -> None:
        self.picked.append(self.previous.gather(-1, tokens[:, None]).squeeze(-1))
        self.previous = None

    def finish(self, last_tokens: torch.Tensor) -> torch.Tensor:
        """[b, steps] log-probs of the generated tokens, given the last step's tokens."""
        if self.previous is not None:
            self._pick(last_tokens)
        if not self.picked:
            return torch.zeros((last_tokens.shape[0], 0))
        return torch.stack(self.picked, dim=1)
