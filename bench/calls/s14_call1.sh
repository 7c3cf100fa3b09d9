#!/bin/bash
# Session 14, device call 1. Carry [".whl", ".tcache_in", ".fixtures"].
# Ran on the first version of the code committed in 13c9ec9 (removed again in b153df0).
# Issue 10: the bulk-staged tensor-core GEMV (gemv_mma_bulk.cuh, tf_mmb): weights brought into a
# shared-memory ring by cp.async.bulk, so a whole stage is in flight while the warps compute.
#  1. its device tests (against gguf-py dequantization and gemv_cuda; bitwise repeatability);
#  2. per matrix at the FFN shapes, N = 1, 5, 8: tf_mma_rt / pipe (bulk 0) against bulk nst 2, 3;
#  3. the M = 5 verify block, default then TIGHTFIT_MMA_BULK=1.
export TIGHTFIT_DEVICE_EMBED=1
CFGS='[{"bulk":0},{"bulk":1,"nst":2},{"bulk":1,"nst":3}]'
exec bash bench/suite.sh 570 \
 "tests|170|python3 -m pytest -q -x tests/test_gemv_mma_device.py -k bulk 2>&1 | grep -E '^E |passed|failed|Error' | tail -8" \
 "gemv|130|python3 bench/gemv.py --impls mma --formats IQ4_XS,Q5_K,Q4_K,Q6_K --check-shapes '' --shapes ffn --ns 1,5,8 --configs '$CFGS' --budget 100 --out \$D > \$D/full.txt 2>&1; grep -E '^\\| mma|bandwidth|copy' \$D/full.txt | cut -d'|' -f2-8,11- | head -50" \
 "v0|100|python3 bench/verify_profile.py --ms 5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -E 'step:|graph|tf_m' \$D/v.txt | head -8; exit \$rc" \
 "v1|100|TIGHTFIT_MMA_BULK=1 python3 bench/verify_profile.py --ms 5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -E 'step:|graph|tf_m' \$D/v.txt | head -8; exit \$rc"
