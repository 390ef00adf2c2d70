#!/usr/bin/env bash
# Issue 19's GPU numbers in one device call (an nvidia-h100-x2): on GPU 0 the
# Llama table (benchmarks/models.py), then the host path of a cached launch
# (benchmarks/host_overhead.py) and warm starts (benchmarks/warm_start.py); on
# GPU 1 meanwhile, the randomized differential test (FUZZ_SEEDS, FUZZ_N cases
# each) and RETEST (pytest node ids). Logs under $OUT.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/circbuf_out}; mkdir -p "$O"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1
(
  export CUDA_VISIBLE_DEVICES=1 CIRCBUF_CACHE_DIR=/tmp/cbc_fuzz CIRCBUF_DEBUG_HANG=2000000
  for s in ${FUZZ_SEEDS:-}; do
    timeout ${FUZZ_TIMEOUT:-200} python3 -m tests.fuzz --mode cuda --n ${FUZZ_N:-40} --seed $s -v > "$O/fuzz_$s.log" 2>&1 &
  done
  wait
  [ -n "${RETEST:-}" ] && timeout 200 python3 -m pytest -q -p no:cacheprovider $RETEST > "$O/retest.log" 2>&1
) &
export CUDA_VISIBLE_DEVICES=0 CIRCBUF_CACHE_DIR=/tmp/cbc_models
timeout ${MODELS_TIMEOUT:-400} python3 benchmarks/models.py ${MODELS_ARGS:-} > "$O/models.txt" 2>&1
echo "models rc=$?"
timeout 60 python3 benchmarks/host_overhead.py > "$O/host.txt" 2>&1
timeout 90 python3 benchmarks/warm_start.py --repeat 3 > "$O/warm.txt" 2>&1
wait
grep -v Warning "$O/models.txt" | tail -40
tail -15 "$O/host.txt"; tail -12 "$O/warm.txt"
for f in "$O"/fuzz_*.log; do [ -f "$f" ] && { echo "== $f"; sed -n '/^cases:/,/^bug:\|^fuzz-error:/p' "$f" | head -12; grep -a "bug:" "$f" | head -5; }; done
[ -f "$O/retest.log" ] && tail -5 "$O/retest.log"
