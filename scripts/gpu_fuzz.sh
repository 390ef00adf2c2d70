#!/usr/bin/env bash
# The randomized differential test on the lent GPU: JOBS processes side by side,
# seeds SEED0.. SEED0+JOBS-1, N cases each; a log per process under $OUT and the
# summed counts last. Usage (device tool): JOBS=8 N=250 bash scripts/gpu_fuzz.sh
set -u
OUT=${OUT:-/tmp/circbuf_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 CIRCBUF_CACHE_DIR=/tmp/circbuf_cache
export CIRCBUF_DEBUG_HANG=${CIRCBUF_DEBUG_HANG:-2000000}
jobs=${JOBS:-8}; n=${N:-250}; s0=${SEED0:-100}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l); ((ngpu > 0)) || ngpu=1
for ((i = 0; i < jobs; i++)); do
  CUDA_VISIBLE_DEVICES=$((i % ngpu)) timeout ${FUZZ_TIMEOUT:-420} python3 -m tests.fuzz --mode cuda --n "$n" --seed $((s0 + i)) --show ${SHOW:-4} -v \
    > "$OUT/fuzz_$((s0 + i)).log" 2>&1 &
done
wait
for ((i = 0; i < jobs; i++)); do echo "== seed $((s0 + i))"; sed -n '/^cases:/,$p' "$OUT/fuzz_$((s0 + i)).log" | head -n ${TAIL:-40}; done
