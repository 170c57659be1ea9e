# Background driver of the 2026-11-28 (late, second) nvidia-h200 machine: issue 27's 1.5b_1gpu, the tuner's plan
# (vLLM now kept awake where its share fits beside training) against the hand plan; then the tuned plan asleep.
set -x
unset OUT
cd /tmp/repo
. /tmp/env.sh
(while true; do echo "$(date -u +%T) $(free -m | awk '/Mem:/{print $3}')" >> /tmp/res/mem.txt; sleep 5; done) > /dev/null 2>&1 &
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2
while [ ! -f /tmp/prep.done ]; do sleep 3; done; cat /tmp/prep.txt
timeout ${TUNE_S:-330} python bench/tune.py --configs 1.5b_1gpu --variants tuned,hand,tuned_asleep --steps 5 \
  --budget-s $(( ${TUNE_S:-330} - 15 )) --min-run-s 100 --run-timeout-s 200 --out /tmp/res/t15 > /tmp/res/t15_console.txt 2>&1
echo "tune rc=$?"; date -u
touch /tmp/res/done
