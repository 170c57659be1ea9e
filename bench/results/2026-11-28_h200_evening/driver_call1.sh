# Background driver of the 2026-11-28 (evening) nvidia-h200 session: the GPU draw's test, issue 27's 7B tuned
# against verl's hand plan on one H200 (two rounds), then, if time is left, issue 25's w1 beside verl (fused kernels).
set -x
cd /tmp/repo
. /tmp/env.sh
T0=$(date +%s); END=$((T0 + ${DRIVER_S:-1330}))
left() { echo $((END - $(date +%s))); }
mkdir -p /tmp/res/t7 /tmp/res/sbs
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.max --format=csv; nproc; free -g | head -2
timeout 240 python -m pytest -q -rs -m gpu tests/engine/test_random_models.py -p no:cacheprovider > /tmp/res/t_random.txt 2>&1
echo "random rc=$?"; date -u
B=$(( $(left) - 40 )); [ $B -gt 1050 ] && B=1050
timeout $((B + 60)) python bench/tune.py --configs 7b_1gpu --gpu-memory 139.8 --variants tuned,hand_verl --steps 4 --rounds 2 \
  --budget-s $B --min-run-s 200 --run-timeout-s 420 --out /tmp/res/t7 > /tmp/res/t7_console.txt 2>&1
echo "tune rc=$?"; date -u
B=$(( $(left) - 30 ))
if [ $B -gt 420 ]; then
  timeout $((B + 60)) python bench/verl_side_by_side.py --workloads w1 --sides rlconf,verl --steps 5 --verl-site /tmp/verlsite \
    --out /tmp/res/sbs --budget-s $B --run-timeout-s $((B - 60)) actor_rollout_ref.model.use_fused_kernels=true > /tmp/res/sbs_console.txt 2>&1
  echo "sbs rc=$?"; date -u
fi
touch /tmp/res/done
