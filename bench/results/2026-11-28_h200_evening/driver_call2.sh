# Background driver, 2026-11-28 evening, second nvidia-h200 machine: issue 27's 7B on one H200, verl's hand plan
# then the tuned plan, with the optimizer released before the end-of-run export; host memory sampled every 2 s.
set -x
unset OUT
cd /tmp/repo
. /tmp/env.sh
mkdir -p /tmp/res/t7
(while true; do echo "$(date +%s) $(free -m | sed -n 2p)"; sleep 2; done > /tmp/res/mem.txt 2>&1 &)
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; free -g | head -2
B=${TUNE_BUDGET_S:-560}
timeout $((B + 40)) python bench/tune.py --configs 7b_1gpu --gpu-memory 139.8 --variants hand_verl,tuned --steps 4 \
  --budget-s $B --min-run-s 200 --run-timeout-s 300 --out /tmp/res/t7 > /tmp/res/t7_console.txt 2>&1
echo "tune rc=$?"; date -u
touch /tmp/res/done
