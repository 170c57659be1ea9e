"""The single controller's parts: a step's stages as named units, and how batches reach the workers.

    samples.py     a step's prompts expanded to n samples, with what the reward reads; decoding
    dispatch.py    a batch split over a worker group's ranks and put back in row order
    advantages.py  token rewards (KL in the reward) -> advantages, for every adv_estimator
    stages.py      StepStages: generate, score, filter groups, old / ref log-probs, values,
                   advantages, critic and actor updates, weight sync

engine/trainer.py calls the stages one after another (the synchronous schedule); an overlapped
schedule calls the same units from a producer (generate, score) and a consumer (the rest).
"""
