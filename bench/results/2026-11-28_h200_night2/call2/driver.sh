# One H200, the session's last ~7 minutes (2026-11-28, session 17): where the in-process engine's CPU time goes
# (cProfile of a steady generate, log-probs on and off), and AsyncLLM in verl's layout (mp executor).
set -x
unset OUT
cd /tmp/repo
. /tmp/env.sh
mkdir -p /tmp/res/p1 /tmp/res/p2 /tmp/res/mp
date -u; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; nproc
python -c "from engine.models.loading import resolve_model_path; print(resolve_model_path('random://Qwen2.5-0.5B'))"
timeout 150 python bench/vllm_alone.py --modes inprocess --repeats 3 --junk-objects 0 --timeout-s 140 \
  --engine-kwargs '{"async_scheduling": true}' --profile vllm.entrypoints.llm.LLM.generate@3 --out /tmp/res/p1 > /tmp/res/p1_console.txt 2>&1
echo "p1 rc=$?"; date -u
timeout 100 python bench/vllm_alone.py --modes inprocess --repeats 3 --junk-objects 0 --timeout-s 90 \
  --engine-kwargs '{"async_scheduling": true, "_logprobs": false}' --profile vllm.entrypoints.llm.LLM.generate@3 --out /tmp/res/p2 > /tmp/res/p2_console.txt 2>&1
echo "p2 rc=$?"; date -u
timeout 120 python bench/vllm_alone.py --modes asyncllm --repeats 4 --junk-objects 0 --timeout-s 110 \
  --engine-kwargs '{"async_scheduling": true, "distributed_executor_backend": "mp"}' --out /tmp/res/mp > /tmp/res/mp_console.txt 2>&1
echo "mp rc=$?"; date -u
touch /tmp/res/done
