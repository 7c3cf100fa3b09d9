#!/bin/bash
# Session 15, device call 5. Carry [".whl", ".tcache_in", ".fixtures"].
# The 2-3-bit formats of the seed mix at N = 2-8 on gemv_cuda: auto (tf_gemv3 from N = 4) against the
# v2 bodies (kern v4). At M = 5 they cost ~1 ms of the verify block on tf_gemv3 (call 3); at N = 2, 3
# the v2 bodies grew ~7 us per column, so they may stay ahead further than the 4-bit formats.
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 300 \
 "low|200|python3 bench/gemv.py --impls cu --formats IQ2_S,IQ3_XXS,Q3_K,IQ2_XS,IQ3_S --check-shapes '' --shapes ffn,attn --ns 2,4,5,8 --configs '[{}, {\"kern\": \"v4\"}]' --budget 180 --out \$D > \$D/full.txt 2>&1; grep -E '^\\| cu' \$D/full.txt | cut -c1-80 | tail -90"
