# Background driver of the 2026-11-28 (night, second) nvidia-h200-x2 machine: the compiled layers' no-recompile GPU
# test, then issue 27's 7b_2gpu tuned (the KV-sized share) against the hand plan, five steps a launch.
set -x
unset OUT
cd /tmp/repo
. /tmp/env.sh
mkdir -p /tmp/res/t7
(while true; do echo "$(date -u +%T) $(free -m | awk '/Mem:/{print $3}')" >> /tmp/res/mem.txt; sleep 5; done) > /dev/null 2>&1 &
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2
timeout 120 python -m pytest -q -rs -m gpu tests/engine/test_compile_layers.py -p no:cacheprovider > /tmp/res/t_compile.txt 2>&1
echo "compile test rc=$?"; date -u
while [ ! -f /tmp/prep.done ]; do sleep 3; done; cat /tmp/prep.txt
timeout 600 python bench/tune.py --configs 7b_2gpu --variants tuned,hand --steps 5 \
  --budget-s 540 --min-run-s 150 --run-timeout-s 330 --out /tmp/res/t7 > /tmp/res/t7_console.txt 2>&1
echo "tune rc=$?"; date -u
touch /tmp/res/done
