#!/bin/bash
# Session 6, device call 6: decode per KV type at 0 / 8K / 32K / 128K with the new defaults (issues
# 7, 11), the device tests of what changed (even split-K attention, merged launches, PDL), every
# 2-3-bit / ternary GEMV format at real shapes N = 1..16 (issue 6) and the TQ1_0 timing row.
exec bash bench/suite.sh 470 \
 "e2e|200|TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 64 --depths 0,8192,32768,131072 --ctx 131584 --kv-types f16,q8_0,tq3 --out \$D" \
 "tests|60|python3 -m pytest -q tests/test_kernels_step.py tests/test_merge_linears.py tests/test_pdl_triton.py 2>&1 | tail -6" \
 "lowbit|90|python3 -m pytest -q tests/test_gemv_cuda_device.py -k lowbit 2>&1 | tail -12" \
 "tq1|40|python3 bench/gemv.py --impls cu --formats TQ1_0 --check-shapes kv --check-ns 1,8 --shapes ffn,kv --ns 1,8 --budget 30 --out \$D | tail -12"
