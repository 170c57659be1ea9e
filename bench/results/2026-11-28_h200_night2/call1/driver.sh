# Background driver for the next one-H200 session (written 2026-11-28 late): keep_awake_factor at 1.5B in process,
# paired launches tuned / tuned_awake / hand at 1.5B, then vLLM alone in process vs AsyncLLM (w1's generation gap).
set -x
unset OUT
cd /tmp/repo
. /tmp/env.sh
T0=$(date +%s); END=$((T0 + ${DRIVER_S:-1600}))
left() { echo $((END - $(date +%s))); }
mkdir -p /tmp/res/gc15 /tmp/res/t15 /tmp/res/va
(while true; do echo "$(date -u +%T) $(free -m | awk '/Mem:/{print $3}')" >> /tmp/res/mem.txt; sleep 5; done) > /dev/null 2>&1 &
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc; free -g | head -2
while [ ! -f /tmp/prep.done ]; do sleep 3; done; cat /tmp/prep.txt
timeout 330 python bench/tune_generate_costs.py --config 1.5b_1gpu --points util_0.3-async,util_0.3-async-awake \
  --rounds 6 --out /tmp/res/gc15 > /tmp/res/gc15_console.txt 2>&1
echo "gc rc=$?"; date -u
B=$(( $(left) - 260 ))
timeout $((B + 30)) python bench/tune.py --configs 1.5b_1gpu --variants tuned,tuned_awake,hand --rounds 2 --steps 5 \
  --budget-s $B --min-run-s 110 --run-timeout-s 220 --out /tmp/res/t15 > /tmp/res/t15_console.txt 2>&1
echo "tune rc=$?"; date -u
B=$(( $(left) - 10 ))
if [ $B -gt 200 ]; then
  timeout $B python bench/vllm_alone.py --modes inprocess,asyncllm --rounds 1 --timeout-s $(( (B - 20) / 4 )) \
    --engine-kwargs '{"async_scheduling": true}' --engine-kwargs '{"async_scheduling": true, "_logprobs": false}' --out /tmp/res/va > /tmp/res/va_console.txt 2>&1
  echo "va rc=$?"; date -u
fi
touch /tmp/res/done
