#!/usr/bin/env bash
# One call on the lent GPU: GPU tests, then benchmarks; full logs under $OUT,
# a short table last. Usage (device tool): bash scripts/gpu_check.sh [tests|bench|all]
set -u
what=${1:-all}
OUT=${OUT:-/tmp/circbuf_out}; mkdir -p "$OUT"; export OUT
# the checkout is on PYTHONPATH, not pip-installed: a dist-info beside it registers
# pyproject's torch_dynamo_backends entry point as `pip install -e .` would
META=/tmp/circbuf_meta/circbuf-0.0.dev0.dist-info; mkdir -p "$META"
printf 'Metadata-Version: 2.1\nName: circbuf\nVersion: 0.0.dev0\n' > "$META/METADATA"
printf '[torch_dynamo_backends]\ncircbuf = circbuf.dynamo:backend\n' > "$META/entry_points.txt"
export PYTHONPATH=$PWD:/tmp/circbuf_meta${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
export CIRCBUF_CACHE_DIR=/tmp/circbuf_cache
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch, cuda.bindings, hypothesis; from cuda.bindings import nvrtc; print('torch', torch.__version__, 'nvrtc', nvrtc.nvrtcVersion()[1:])" | tee -a "$OUT/gpu.txt"
summary=()
if [[ $what == tests || $what == all ]]; then
  # SHARDS pytest processes side by side (kernel compiles are CPU-bound), each
  # with its own log; a kernel that traps only takes its own shard down
  n=${SHARDS:-8}
  ngpu=$(nvidia-smi -L 2>/dev/null | wc -l); ((ngpu > 0)) || ngpu=1
  for ((i = 0; i < n; i++)); do
    # on a machine of several GPUs, the shards take turns (a shard sees one GPU)
    CUDA_VISIBLE_DEVICES=$((i % ngpu)) \
    CIRCBUF_SHARD=$i/$n CIRCBUF_DEBUG_HANG=${CIRCBUF_DEBUG_HANG:-2000000} timeout ${TEST_TIMEOUT:-480} \
      python3 -m pytest -q -p no:cacheprovider ${PYTEST_ARGS:-tests} > "$OUT/pytest_$i.log" 2>&1 &
  done
  wait
  cat "$OUT"/pytest_*.log > "$OUT/pytest.log"
  for ((i = 0; i < n; i++)); do summary+=("pytest shard $i/$n: $(tail -n 1 "$OUT/pytest_$i.log")"); done
fi
if [[ $what == bench || $what == all ]]; then
  for b in ${BENCHES:-pointwise host_overhead normalization outer_reduction}; do
    timeout 300 python3 benchmarks/$b.py ${BENCH_ARGS:-} > "$OUT/bench_$b.log" 2>&1
    summary+=("bench $b: exit $?")
  done
fi
echo "================ summary ================"
cat "$OUT/gpu.txt"
for s in "${summary[@]}"; do echo "$s"; done
grep -E "FAILED|Error" "$OUT/pytest.log" 2>/dev/null | head -20
for b in ${BENCHES:-pointwise host_overhead normalization outer_reduction}; do [[ -f $OUT/bench_$b.log ]] && tail -n ${TAIL:-12} "$OUT/bench_$b.log"; done
