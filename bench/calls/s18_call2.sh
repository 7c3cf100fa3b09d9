#!/bin/bash
# Session 18, device call 2. Carry [".whl", ".tcache_in", ".fixtures"].
# gemv_mmh kind "fold" (tf_mmh2_iq4: group scale folded into bf16 weights, 8-byte weight loads)
# and "foldp" (x packed to bf16 pairs by xpack; 2 or 3 CTAs per SM) against kind "table" and the dp4a N = 1 kernel; device tests of both kinds.
exec bash bench/suite.sh 420 \
 "mmh|200|python3 bench/mmh.py --out \$D --shapes 5120x17408,17408x5120,5120x12288,5120x10240 --ns 1,5,8 --check-ns 1,5" \
 "tests|180|python3 -m pytest -q -x tests/test_gemv_mmh_device.py 2>&1 | tail -15"
