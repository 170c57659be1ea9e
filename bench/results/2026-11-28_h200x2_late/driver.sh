# Background driver of the 2026-11-28 (late) nvidia-h200-x2 machine: the GPU tests of the symbolic longest-sequence
# int and of sampling without log-probs; issue 27's 7b_2gpu tuned / hand / tuned_awake; issue 25's w2 beside verl
# with its fused kernels; then, if time is left, vLLM alone in process vs AsyncLLM.
set -x
unset OUT
cd /tmp/repo
. /tmp/env.sh
T0=$(date +%s); END=$((T0 + ${DRIVER_S:-1300}))
left() { echo $((END - $(date +%s))); }
mkdir -p /tmp/res/t7 /tmp/res/sbs2 /tmp/res/va
(while true; do echo "$(date -u +%T) $(free -m | awk '/Mem:/{print $3}')" >> /tmp/res/mem.txt; sleep 5; done) > /dev/null 2>&1 &
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2
timeout 200 python -m pytest -q -rs -m gpu -p no:cacheprovider tests/engine/test_compile_layers.py \
  tests/engine/test_vllm_rollout.py -k "longest_sequence or without_log_probs or log_probs_that_match" > /tmp/res/t_gpu.txt 2>&1
echo "gpu tests rc=$?"; date -u
while [ ! -f /tmp/prep.done ]; do sleep 3; done; cat /tmp/prep.txt
B=$(( $(left) - 560 )); [ $B -gt 600 ] && B=600
timeout $((B + 40)) python bench/tune.py --configs 7b_2gpu --variants tuned,hand,tuned_awake --steps 5 \
  --budget-s $B --min-run-s 150 --run-timeout-s 330 --out /tmp/res/t7 > /tmp/res/t7_console.txt 2>&1
echo "tune rc=$?"; date -u
B=$(( $(left) - 20 ))
if [ $B -gt 300 ]; then
  timeout $((B + 40)) python bench/verl_side_by_side.py --workloads w2 --sides rlconf,verl --steps 5 --verl-site /tmp/verlsite \
    --out /tmp/res/sbs2 --budget-s $B --run-timeout-s 600 actor_rollout_ref.model.use_fused_kernels=true > /tmp/res/sbs2_console.txt 2>&1
  echo "sbs rc=$?"; date -u
fi
B=$(( $(left) - 10 ))
if [ $B -gt 200 ]; then
  CUDA_VISIBLE_DEVICES=0 timeout $B python bench/vllm_alone.py --modes inprocess,asyncllm --rounds 1 --timeout-s $(( (B - 20) / 4 )) \
    --engine-kwargs '{"async_scheduling": true}' '{"async_scheduling": true, "_logprobs": false}' --out /tmp/res/va > /tmp/res/va_console.txt 2>&1
  echo "va rc=$?"; date -u
fi
touch /tmp/res/done
