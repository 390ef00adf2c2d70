#!/usr/bin/env bash
# A session's last check on a 2-GPU machine: issue 22's distributed tests and
# benchmark on both GPUs; then, side by side, GPU 0: the cluster and ladder GPU
# tests and the GEMM ladder's table; GPU 1: the GPU tests named in $RETEST and
# the cluster benchmark (each timing beside cuBLAS on its own GPU, same run).
# Usage (device tool, kind nvidia-h100-x2): bash scripts/gpu_final_x2.sh
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CIRCBUF_DEBUG_HANG=${CIRCBUF_DEBUG_HANG:-2000000}
O=${OUT:-/tmp/circbuf_out}; mkdir -p "$O"
OUT=/tmp/o_dist TEST_TIMEOUT=${DIST_TEST_TIMEOUT:-120} BENCH_TIMEOUT=${DIST_BENCH_TIMEOUT:-150} \
  bash scripts/gpu_distributed.sh > "$O/distributed.txt" 2>&1
cp /tmp/o_dist/bench_distributed.log /tmp/o_dist/pytest_distributed.log "$O/" 2>/dev/null
(
  export CUDA_VISIBLE_DEVICES=0 CIRCBUF_CACHE_DIR=/tmp/cbc0
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu tests/test_gpu_cluster.py tests/test_gemm_ladder.py > "$O/pytest_cluster_ladder.log" 2>&1
  env -u CIRCBUF_DEBUG_HANG OUT=/tmp/o_ladder timeout ${LADDER_TIMEOUT:-240} bash scripts/gpu_ladder.sh > "$O/ladder.txt" 2>&1
) &
(
  export CUDA_VISIBLE_DEVICES=1 CIRCBUF_CACHE_DIR=/tmp/cbc1
  timeout 200 python3 -m pytest -q -p no:cacheprovider -m gpu ${RETEST:-} > "$O/pytest_retest.log" 2>&1
  env -u CIRCBUF_DEBUG_HANG timeout ${CLUSTER_BENCH_TIMEOUT:-200} python3 benchmarks/matmul.py --clusters > "$O/clusters.txt" 2>&1
) &
wait
echo "== distributed"; tail -n 12 "$O/distributed.txt"
echo "== cluster + ladder tests: $(tail -n 1 "$O/pytest_cluster_ladder.log")"; grep -a "^FAILED" "$O/pytest_cluster_ladder.log" | head
echo "== retest: $(tail -n 1 "$O/pytest_retest.log")"; grep -a "^FAILED" "$O/pytest_retest.log" | head
echo "== ladder"; tail -n 16 "$O/ladder.txt"
echo "== clusters"; grep -v Warning "$O/clusters.txt" | tail -n 24
