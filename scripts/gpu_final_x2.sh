#!/usr/bin/env bash
# The second call of a session's final check on a 2-GPU machine (after
# scripts/gpu_session.sh): issue 22's distributed tests and benchmark on both
# GPUs, then the GEMM ladder (GPU 0) beside the matmul sweep with clusters
# (GPU 1), each with cuBLAS timed in its own run on its own GPU. Logs under $OUT.
# Usage (device tool, kind nvidia-h100-x2): bash scripts/gpu_final_x2.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/circbuf_out}; mkdir -p "$O"
OUT=/tmp/o_dist TEST_TIMEOUT=${DIST_TEST_TIMEOUT:-150} BENCH_TIMEOUT=${DIST_BENCH_TIMEOUT:-150} \
  bash scripts/gpu_distributed.sh > "$O/distributed.txt" 2>&1
cp /tmp/o_dist/bench_distributed.log /tmp/o_dist/pytest_distributed.log "$O/" 2>/dev/null
CUDA_VISIBLE_DEVICES=0 OUT=/tmp/o_ladder timeout ${LADDER_TIMEOUT:-330} bash scripts/gpu_ladder.sh > "$O/ladder.txt" 2>&1 &
CUDA_VISIBLE_DEVICES=1 CIRCBUF_CACHE_DIR=/tmp/cbc_sweep timeout ${SWEEP_TIMEOUT:-330} \
  python3 benchmarks/matmul.py --sweep > "$O/sweep.txt" 2>&1 &
wait
echo "== distributed"; tail -n 14 "$O/distributed.txt"
echo "== ladder"; tail -n 16 "$O/ladder.txt"
echo "== sweep"; grep -v Warning "$O/sweep.txt" | tail -n 30
