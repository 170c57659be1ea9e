"""Worker processes: one per GPU (per CPU slot on CPU), forming one torch.distributed group per role.

Folders by concern, each importing only from the ones below it (and from `engine.batch`,
`engine.algos`, `engine.models`, which import no worker code):

    roles/      what a worker *is*: the actor + rollout + reference worker, the critic, the reward
                model. A new role is one new file here, built from the folders below.
    passes/     what a role *runs* over a batch: the PPO update loop (epochs -> mini -> micro
                batches), log-prob and value forwards, a score per sequence (at its last token),
                micro-batch planning, π_old's first-pass metrics.
    sequence/   how a micro batch's tokens sit on the device and are computed: packing (remove
                padding), Ulysses sequence parallelism, packed attention (flash-attn-4) and the
                loss-head kernels (fused chunks, Triton).
    fsdp/       FSDP2 mechanics: sharding, offload, gathering full weights for the rollout,
                sharded checkpoints, the optimizer, peak memory.
    cluster/    processes and Ray: worker groups (Ray or in-process), placement groups, rendezvous,
                devices and process groups, worker failures, per-step profiles.

Imports run one way: roles -> passes -> sequence -> fsdp -> cluster -> engine.batch.
`engine.rollout` (vLLM, HF generate) sits beside the workers and never imports them; a role holds a
rollout backend, not the other way round. tests/test_import_layers.py checks both directions (docs/architecture.md draws them).
"""
