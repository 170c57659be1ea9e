# Background driver of the 2026-11-28 (night) nvidia-h200-x2 session: issue 25's w4 (7B on two GPUs, offload,
# rollout TP 2) beside verl 0.9.1 with its fused kernels; then, if time is left, issue 27's 7b_2gpu tuned vs hand.
set -x
unset OUT
cd /tmp/repo
. /tmp/env.sh
T0=$(date +%s); END=$((T0 + ${DRIVER_S:-1250}))
left() { echo $((END - $(date +%s))); }
mkdir -p /tmp/res/sbs /tmp/res/t7
(while true; do echo "$(date -u +%T) $(free -m | awk '/Mem:/{print $3}')" >> /tmp/res/mem.txt; sleep 2; done) &
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2
while [ ! -f /tmp/prep.done ]; do sleep 3; done; cat /tmp/prep.txt
B=$(( $(left) - 30 ))
timeout $((B + 60)) python bench/verl_side_by_side.py --workloads w4 --sides rlconf,verl --steps 4 --verl-site /tmp/verlsite \
  --out /tmp/res/sbs --budget-s $B --run-timeout-s 900 actor_rollout_ref.model.use_fused_kernels=true > /tmp/res/sbs_console.txt 2>&1
echo "sbs rc=$?"; date -u
B=$(( $(left) - 20 ))
if [ $B -gt 400 ]; then
  timeout $((B + 40)) python bench/tune.py --configs 7b_2gpu --gpu-memory 139.8 --variants tuned,hand --steps 4 \
    --budget-s $B --min-run-s 200 --run-timeout-s 400 --out /tmp/res/t7 > /tmp/res/t7_console.txt 2>&1
  echo "tune rc=$?"; date -u
fi
touch /tmp/res/done
