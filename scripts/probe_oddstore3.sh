#!/bin/bash
# Device run of the oddstore probes (issue 18): new code, main's, unroll 8, then GPU tests.
cd shared_wt_oddstore
export CIRCBUF_CACHE_DIR=/tmp/cbc3
PYTHONPATH=$PWD timeout 70 python3 scripts/probe_oddstore3.py new 2>&1 | grep '^\[\|Error\|error' | head -60
mkdir -p /tmp/m/scripts && cp scripts/probe_oddstore.py scripts/probe_oddstore3.py /tmp/m/scripts/
(cd .. && CIRCBUF_CACHE_DIR=/tmp/cbc_main PYTHONPATH=$PWD timeout 30 python3 /tmp/m/scripts/probe_oddstore3.py main --short 2>&1 | grep '^\[\|Error' | head)
CIRCBUF_CACHE_DIR=/tmp/cbc_u8 PYTHONPATH=$PWD timeout 30 python3 scripts/probe_oddstore3.py unroll8 --short --unroll 8 2>&1 | grep '^\[\|Error' | head
PYTHONPATH=$PWD timeout 100 python3 -m pytest -q -m gpu tests/test_matmul_rows_store.py tests/test_realign.py -p no:cacheprovider 2>&1 | tail -6
