#!/bin/bash
# Session 15, device call 4. Carry [".whl", ".tcache_in", ".fixtures"].
# NC = 4, the column count call 2 did not measure: gemv_cuda auto (tf_gemv3 there) against the v2
# bodies (kern v4) and the tensor-core kernel on the 27B's shapes; the verify block M = 4 with v3
# from NC = 4 (default) and from NC = 5 (TIGHTFIT_CU_AUTO_V3_MIN_NC=5), same machine.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 4 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph" $D/v.txt | head -4; exit $rc'
exec bash bench/suite.sh 400 \
 "n4|150|python3 bench/gemv.py --impls cu,mma --formats IQ4_XS,Q5_K,Q6_K,Q4_K --check-shapes '' --shapes ffn,attn,other --ns 4 --configs '[{}, {\"kern\": \"v4\"}]' --budget 130 --out \$D > \$D/full.txt 2>&1; tail -40 \$D/full.txt" \
 "m4a|80|$V" \
 "m4b|70|TIGHTFIT_CU_AUTO_V3_MIN_NC=5 $V"
