#!/bin/bash
# Session 17, device call 11. Carry [".whl", ".tcache_in", ".fixtures"].
# After the review's refactor (tf_mma_warp_range shared by every stream-K kernel): the tensor-core
# GEMV device tests (gemv_mma, its pipe, gemv_mmh) and the verify block once more.
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 300 \
 "tests|200|python3 -m pytest -q tests/test_gemv_mma_device.py tests/test_gemv_mmh_device.py tests/test_verify_graph.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -6" \
 "on|60|python3 bench/verify_profile.py --ms 5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -E 'step:|graph' \$D/v.txt | head -4; exit \$rc"
