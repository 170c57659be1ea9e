# Background driver of the 2026-11-28 nvidia-h200-x2 session: issue 25's w3 beside verl (fused kernels), then weak scaling.
set -x
cd /tmp/repo
export PYTHONPATH=/tmp/repo:/tmp/site VLLM_USE_FLASHINFER_SAMPLER=0 RAY_AUTH_MODE=disabled PYTHONUNBUFFERED=1 BENCH_COMMIT=1eeff9f
KNOBS="actor_rollout_ref.rollout.engine_kwargs.vllm.async_scheduling=true actor_rollout_ref.model.use_remove_padding=true actor_rollout_ref.actor.use_dynamic_bsz=true actor_rollout_ref.actor.ppo_max_token_len_per_gpu=34816"
mkdir -p /tmp/res/sbs /tmp/res/s05 /tmp/res/s15
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max --format=csv; nproc; free -g | head -2; lscpu | grep -i "model name\|numa"
timeout 720 python3 bench/verl_side_by_side.py --workloads w3 --sides rlconf,verl --steps 5 --verl-site /tmp/verlsite \
  --out /tmp/res/sbs --budget-s 705 --run-timeout-s 560 actor_rollout_ref.model.use_fused_kernels=true > /tmp/res/sbs_console.txt 2>&1
echo "sbs rc=$?"; date -u
OUT=/tmp/res/s05 timeout 520 python3 bench/scaling.py --model random://Qwen2.5-0.5B --configs 1gpu,2gpu_tp1 --steps 8 --rounds 2 \
  --run-timeout-s 130 --budget-s 505 $KNOBS > /tmp/res/s05_console.txt 2>&1
echo "s05 rc=$?"; date -u
OUT=/tmp/res/s15 timeout 520 python3 bench/scaling.py --model random://Qwen2.5-1.5B --configs 2gpu_tp1,1gpu --steps 7 --rounds 2 \
  --run-timeout-s 140 --budget-s 505 $KNOBS > /tmp/res/s15_console.txt 2>&1
echo "s15 rc=$?"; date -u
touch /tmp/res/done
