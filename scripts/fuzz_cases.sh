#!/usr/bin/env bash
# Run listed fuzz cases on the GPU (cuda mode), printing the failing ones' source.
# Usage (device tool): bash scripts/fuzz_cases.sh FILE_OF_SEED:INDEX_LINES
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 CIRCBUF_CACHE_DIR=/tmp/circbuf_cache CIRCBUF_DEBUG_HANG=${CIRCBUF_DEBUG_HANG:-2000000}
while read -r c; do
  out=$(timeout 120 python3 -m tests.fuzz --mode cuda --case "$c" --show 1 2>&1)
  head -n 1 <<< "$out" | grep -v "\] ok\|refused\|skip" && echo "$out" | head -n 60
done < "$1"
