#!/usr/bin/env bash
# The fourth session's last device call (an nvidia-h100-x2), everything in one:
# A) the GPU suite (16 shards over both GPUs) with the randomized differential
#    test beside it (FUZZ_SEEDS, FUZZ_N cases each; correctness only);
# B) then, side by side: GPU 0 the Llama forward table (benchmarks/models.py,
#    MODELS_ARGS), the host path of a cached launch, then BENCHES0; GPU 1
#    BENCHES1 (matmul.py argument lists, ';'-separated).
# Few files under $OUT (the device returns at most 8); a summary on stdout.
set -u
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
O=${OUT:-/tmp/circbuf_out}; mkdir -p "$O"
T=/tmp/s4; mkdir -p $T
(
  export CUDA_VISIBLE_DEVICES=1 CIRCBUF_CACHE_DIR=/tmp/cbc_fuzz CIRCBUF_DEBUG_HANG=2000000
  for s in ${FUZZ_SEEDS:-}; do
    timeout ${FUZZ_TIMEOUT:-170} python3 -m tests.fuzz --mode cuda --n ${FUZZ_N:-30} --seed $s -v > $T/fuzz_$s.log 2>&1 &
  done
  wait
) &
OUT=$T/tests SHARDS=${SHARDS:-16} TEST_TIMEOUT=${TEST_TIMEOUT:-240} PYTEST_ARGS="-q -m gpu tests" \
  bash scripts/gpu_check.sh tests > $T/tests_summary.txt 2>&1
wait
cp $T/tests/pytest.log "$O/pytest.log"
for f in $T/fuzz_*.log; do echo "== $f"; sed -n '/^cases:/,$p' $f | head -30; done > "$O/fuzz.txt" 2>&1
tail -n 20 $T/tests_summary.txt  # (printed now: a cut call still shows phase A)
echo "== fuzz (summed)"; awk '/^cases:/{next} /^  [a-z]/{c[$1]+=$2} END {for (k in c) print "  " k, c[k]}' "$O/fuzz.txt"
grep -a "bug:" "$O/fuzz.txt" | head -8
bench() {  # matmul.py runs, ';'-separated argument lists, each under BENCH_TIMEOUT
  IFS=';'; for b in $1; do
    unset IFS; echo "=== benchmarks/matmul.py $b"; timeout ${BENCH_TIMEOUT:-90} python3 benchmarks/matmul.py $b 2>&1 | grep -av Warning
  done
}
(
  export CUDA_VISIBLE_DEVICES=1 CIRCBUF_CACHE_DIR=/tmp/cbc_bench1
  bench "${BENCHES1:---odd}" > "$O/bench1.txt" 2>&1
) &
export CUDA_VISIBLE_DEVICES=0 CIRCBUF_CACHE_DIR=/tmp/cbc_models
if [[ ${MODELS_ARGS:-} != none ]]; then  # MODELS_ARGS=none: no model table
  timeout ${MODELS_TIMEOUT:-150} python3 benchmarks/models.py ${MODELS_ARGS:---runs forward --modes eager,circbuf,inductor} 2>&1 \
    | grep -av "Warning\|AUTOTUNE\|triton_mm\|^  mm \|strides:\|dtypes:\|Autotune\|num_choices\|select_algorithm\|warn" > "$O/models.txt"
fi
timeout 60 python3 benchmarks/host_overhead.py > "$O/host.txt" 2>&1
CIRCBUF_CACHE_DIR=/tmp/cbc_bench0 bench "${BENCHES0:-}" > "$O/bench0.txt" 2>&1
wait
echo "== models"; cat "$O/models.txt" | head -40
echo "== host"; tail -n 16 "$O/host.txt"
echo "== bench"; cat "$O/bench0.txt" "$O/bench1.txt" | tail -n 45
