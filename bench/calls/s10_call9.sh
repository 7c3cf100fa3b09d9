#!/bin/bash
# Session 10, device call 9 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 10: which column
# counts of the CUDA GEMV are wrong (call 8: the 27B's N = 5 products on IQ4_XS / Q5_K / Q6_K),
# per kernel variant (auto = v3 at N >= 2 on wide matrices; v4 = tf_gemv2 / tf_gemv there).
exec bash bench/suite.sh 220 \
 "auto|90|python3 -m pytest -q -rf --tb=line tests/test_gemv_cuda_device.py -k every_nc > \$D/full.txt 2>&1; grep -E '^FAILED|passed|failed' \$D/full.txt | cut -c1-160 | head -40" \
 "v4|90|TIGHTFIT_CU_GEMV=v4 python3 -m pytest -q -rf --tb=line tests/test_gemv_cuda_device.py -k every_nc > \$D/full.txt 2>&1; grep -E '^FAILED|passed|failed' \$D/full.txt | cut -c1-160 | head -40"
