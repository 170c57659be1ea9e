"""How a plan's reward is made, in words for `rlconf explain`, and the constants of verl's prime manager.

The engine runs it (engine/rewards/managers.py, engine/controller/stages.py); this module only states
it. As in verl: with a reward model, its score at each response's last token is the reward and the
reward manager's scorer is not called; without one, the manager (naive, dapo, batch, prime) calls
custom_reward_function or the data source's built-in rule.
"""

from __future__ import annotations

from rlconf.reward_loop import serves_reward_model
from rlconf.schema import PlanConfig

# verl's prime manager (verl/workers/reward_manager/prime.py): 64 scoring processes, each response scored
# within 300 s of the batch's start, and 0.0 for one that times out or fails.
PRIME_PROCESSES = 64
PRIME_TIMEOUT_S = 300.0
PRIME_FALLBACK_SCORE = 0.0


def _scorer(plan: PlanConfig) -> str:
    custom = plan.custom_reward_function
    if custom.path:
        return f"custom_reward_function {custom.path}:{custom.name}"
    return f"the built-in rule of each row's {plan.data.reward_fn_key}"


def reward_text(plan: PlanConfig) -> str:
    """One line: what a response's reward is and how the reward manager computes it."""
    rm = plan.reward_model
    if rm.enable:
        text = (f"the reward model's score ({rm.model.path}) at each response's last token; the {rm.reward_manager} "
                f"manager returns it as it is (its scorer is not called, as in verl)")
        if serves_reward_model(plan):  # verl's reward loop: rendered as text, the policy's tokenizer decoding
            text += ("; served by vLLM: each response decoded with the policy's tokenizer and re-rendered as text in the "
                     "reward model's chat template (verl's reward loop), limited by reward_model.rollout.max_model_len")
        elif rm.model.input_tokenizer:
            text += (f"; responses decoded with input_tokenizer {rm.model.input_tokenizer} and re-templated with the "
                     f"reward model's chat template, cut at "
                     + (f"reward_model.max_length {rm.max_length}" if rm.max_length else "the rollout's prompt + response length")
                     + " tokens")
        return text
    scorer = _scorer(plan)
    manager = rm.reward_manager
    if manager == "batch":
        return f"batch manager: {scorer}, called once with the whole batch (one score per response)"
    if manager == "prime":
        return (f"prime manager: {scorer}, once per response in up to {PRIME_PROCESSES} processes; a response not "
                f"scored within {PRIME_TIMEOUT_S:g} s, or whose scorer fails, gets {PRIME_FALLBACK_SCORE}")
    text = f"{manager} manager: {scorer}, once per response"
    overlong = rm.reward_kwargs.overlong_buffer_cfg
    if manager == "dapo" and overlong is not None and overlong.enable:
        text += (f", plus the overlong penalty (the last {overlong.len} of reward_kwargs.max_resp_len "
                 f"{rm.reward_kwargs.max_resp_len} tokens, down to -{overlong.penalty_factor:g})")
    return text
