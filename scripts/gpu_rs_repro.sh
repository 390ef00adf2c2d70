#!/usr/bin/env bash
# The reduce-scatter's CUDA_ERROR_ILLEGAL_INSTRUCTION (issue 22), on ONE GPU, < 90 s:
# 1. the reduce-scatter loopback tests (tests/test_gpu_distributed.py -k reduce_scatter);
# 2. the probe (scripts/gpu_rs_probe.py), one process per variant (a trap loses the
#    context): the fixed kernel; issue 22's first kernel (stores at negative rows:
#    expected to die with the illegal instruction if negative TMA coordinates are the
#    cause); predicated stores whose only negative box straddles two row blocks.
# Usage (device tool, one GPU): bash scripts/gpu_rs_repro.sh
set -u
OUT=${OUT:-/tmp/circbuf_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CIRCBUF_CACHE_DIR=/tmp/circbuf_cache CIRCBUF_DIST_TIMEOUT=5
start=$(date +%s)
timeout -k 5 45 python3 -m pytest -q -x -p no:cacheprovider tests/test_gpu_distributed.py -k reduce_scatter \
  > "$OUT/pytest_rs.log" 2>&1
echo "pytest -k reduce_scatter (exit $?): $(tail -n 1 "$OUT/pytest_rs.log")"
grep -E "^E |FAILED" "$OUT/pytest_rs.log" | head -8
for v in fixed negative straddle; do
  timeout -k 5 14 python3 scripts/gpu_rs_probe.py $v 2>"$OUT/probe_$v.err" | tail -n 1 || echo "probe $v: exit $?"
done
echo "($(( $(date +%s) - start )) s)"
