#!/usr/bin/env bash
# The GEMM ladder on the GPU in one device call (<= 6 minutes): each step of
# examples/gemm_ladder/ runs at its shape, is checked against torch (float64,
# NaN-poisoned output) and timed beside cuBLAS (do_bench medians, same run);
# the table prints last. Usage (device tool): bash scripts/gpu_ladder.sh
# SHAPE="M N K" sets the shape of steps 3-10 (default: each step's, 8192^3);
# steps 1-2 keep their one-tile shapes. Logs under $OUT/ladder_NN.log.
set -u
OUT=${OUT:-/tmp/circbuf_out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CIRCBUF_CACHE_DIR=${CIRCBUF_CACHE_DIR:-/tmp/circbuf_cache} CIRCBUF_POISON_OUTPUTS=1
gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -n 1)
rows=()
for f in examples/gemm_ladder/step*.py; do
  n=$(basename "$f" | sed -E 's/step([0-9]+)_.*/\1/')
  args=()
  [[ -n ${SHAPE:-} && $n -ge 3 ]] && args=(--shape $SHAPE)
  # a step that hangs or traps takes only its own process down (30 s each: compile + timing;
  # no CIRCBUF_DEBUG_HANG: its bounded waits would be timed too)
  timeout ${STEP_TIMEOUT:-30} \
    python3 "$f" "${args[@]}" > "$OUT/ladder_$n.log" 2>&1
  rc=$?
  line=$(grep '^LADDER ' "$OUT/ladder_$n.log" | tail -n 1)
  if [[ -z $line ]]; then
    why=$(grep -E 'Error|error' "$OUT/ladder_$n.log" | tail -n 1 | cut -c1-110)
    line="LADDER step=$n ok=0 exit=$rc ${why:-no result}"
  fi
  rows+=("$line")
done
if [[ ${PINGPONG:-1} == 1 ]]; then  # step 10's ping-pong variant
  timeout ${STEP_TIMEOUT:-30} \
    python3 examples/gemm_ladder/step10_two_consumers.py --pingpong ${SHAPE:+--shape $SHAPE} > "$OUT/ladder_10pp.log" 2>&1
  rows+=("$(grep '^LADDER ' "$OUT/ladder_10pp.log" | tail -n 1 | sed 's/step=10/step=10pp/') (ping-pong)")
fi
echo "================ the GEMM ladder on $gpu ================"
printf '| step | shape | TF/s | cuBLAS TF/s | fraction of cuBLAS | matches torch |\n| --- | --- | --- | --- | --- | --- |\n'
for r in "${rows[@]}"; do
  step=$(sed -nE 's/.*step=([0-9a-z]+).*/\1/p' <<< "$r")
  get() { sed -nE "s/.* $1=([^ ]+).*/\1/p" <<< "$r"; }
  echo "| $step | $(get shape) | $(get tflops) | $(get cublas) | $(get frac) | $(get ok) |"
done
for r in "${rows[@]}"; do [[ $r == *ok=0* ]] && echo "FAILED: $r"; done
exit 0
