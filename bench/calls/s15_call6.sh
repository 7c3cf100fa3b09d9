#!/bin/bash
# Session 15, device call 6. Carry [".whl", ".tcache_in", ".fixtures"].
# auto keeps the v2 bodies through NC = 5 for Q3_K / IQ2_XS / IQ3_XXS / IQ3_S / IQ2_S (call 5). Verify
# blocks M = 4, 5 with it and with TIGHTFIT_CU_AUTO_V3_MIN_NC=4 (call 3's rule for every type), same
# machine; the CUDA GEMV device tests.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 4,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|tf_gemv.*F_(IQ2|IQ3|Q3)" $D/v.txt | head -16; exit $rc'
exec bash bench/suite.sh 400 \
 "new|90|$V" \
 "old|80|TIGHTFIT_CU_AUTO_V3_MIN_NC=4 $V" \
 "tests|170|python3 -m pytest -q -x tests/test_gemv_cuda_device.py tests/test_verify_graph.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -5"
