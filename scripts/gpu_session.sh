#!/usr/bin/env bash
# One device call that checks a change end to end: the GPU suite (sharded), the
# randomized differential test, and the matmul benchmarks; the logs that matter
# under $OUT (the device returns at most 8 files), a summary last.
# Usage (device tool): bash scripts/gpu_session.sh   [FUZZ_SEED0=720 BENCH="table epilogue breakdown"]
# The GPU tests take a shard ~100-180 s (2026-11-25, H100); the whole suite (PYTEST_ARGS=tests) 250-500 s.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/circbuf_out}; mkdir -p "$O"
# the GPU tests only (-m gpu: ~3 minutes over 14 shards on an H100; -v: a killed shard shows its last test); the CPU tests run in CI
OUT=/tmp/o_tests SHARDS=${SHARDS:-14} TEST_TIMEOUT=${TEST_TIMEOUT:-300} PYTEST_ARGS=${PYTEST_ARGS:--v -m gpu tests} \
  bash scripts/gpu_check.sh tests > /tmp/tests_summary.txt 2>&1
cp /tmp/o_tests/pytest.log "$O/pytest.log"
OUT=/tmp/o_fuzz JOBS=${FUZZ_JOBS:-10} N=${FUZZ_N:-200} SEED0=${FUZZ_SEED0:-720} FUZZ_TIMEOUT=${FUZZ_TIMEOUT:-140} TAIL=14 \
  bash scripts/gpu_fuzz.sh > "$O/fuzz.txt" 2>&1
for b in ${BENCH:-epilogue breakdown}; do
  case $b in
    table) args="" ;;
    *) args="--$b" ;;
  esac
  CIRCBUF_CACHE_DIR=/tmp/cbc timeout ${BENCH_TIMEOUT:-120} python3 benchmarks/matmul.py $args > "$O/bench_$b.txt" 2>&1
done
tail -n 18 /tmp/tests_summary.txt
echo "== fuzz (summed over seeds)"
awk '/^== seed/{next} /^  [a-z]/{c[$1]+=$2} END {for (k in c) print "  " k, c[k]}' "$O/fuzz.txt"
grep -E "^\s+[0-9]+\s+bug" "$O/fuzz.txt" | head
for b in ${BENCH:-epilogue breakdown}; do grep -v Warning "$O/bench_$b.txt" | tail -n 14; done
