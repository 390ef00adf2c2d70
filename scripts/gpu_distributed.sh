#!/usr/bin/env bash
# Issue 22 in ONE device call on a 2-GPU (or larger) machine: the distributed GPU
# tests (loopback on one GPU, the timeout, 2 ranks against cuBLAS + NCCL), then the
# benchmark (fused vs cuBLAS GEMM + NCCL vs GEMM alone, 8192^3 and 4096^3 bf16).
# Logs under $OUT, a summary last; each step under `timeout`, about 7 minutes at most.
# Usage (device tool, kind nvidia-h100-x2): bash scripts/gpu_distributed.sh
set -u
OUT=${OUT:-/tmp/circbuf_out}; mkdir -p "$OUT"; export OUT
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CIRCBUF_CACHE_DIR=/tmp/circbuf_cache NCCL_NVLS_ENABLE=0  # NVLink multicast stays off
start=$(date +%s)
{
  nvidia-smi --query-gpu=index,name,driver_version,clocks.sm --format=csv
  nvidia-smi topo -m
  python3 -c "import torch, torch.distributed._symmetric_memory as s; print('torch', torch.__version__, 'gpus', torch.cuda.device_count(), 'nccl', torch.cuda.nccl.version())"
} > "$OUT/gpu.txt" 2>&1
summary=()
# 1. tests: CPU protocol tests are in CI; here the GPU ones (loopback, timeout, 2 ranks; 4 if present)
timeout -k 10 ${TEST_TIMEOUT:-200} python3 -m pytest -q -p no:cacheprovider -rs tests/test_gpu_distributed.py \
  > "$OUT/pytest_distributed.log" 2>&1
summary+=("pytest tests/test_gpu_distributed.py (exit $?): $(tail -n 1 "$OUT/pytest_distributed.log")")
# 2. the benchmark (its JSON: $OUT/bench_distributed.json)
timeout -k 10 ${BENCH_TIMEOUT:-200} python3 benchmarks/distributed.py --world 2 \
  --shapes ${SHAPES:-8192x8192x8192,4096x4096x4096} --iters ${ITERS:-20} > "$OUT/bench_distributed.log" 2>&1
summary+=("bench distributed (exit $?)")
# 3. if the benchmark failed early, the correctness entry alone (short)
if ! grep -q speedup "$OUT/bench_distributed.log"; then
  timeout -k 10 60 python3 benchmarks/distributed.py --world 2 --check --shapes 2048x2048x1024 \
    > "$OUT/check_distributed.log" 2>&1
  summary+=("check distributed 2048x2048x1024 (exit $?): $(tail -n 2 "$OUT/check_distributed.log" | tr '\n' ' ')")
fi
echo "================ summary ($(( $(date +%s) - start )) s) ================"
cat "$OUT/gpu.txt" | head -4
for s in "${summary[@]}"; do echo "$s"; done
grep -E "FAILED|Error|error" "$OUT/pytest_distributed.log" | head -15
grep -E "speedup|check |Error|error" "$OUT/bench_distributed.log" | head -20
