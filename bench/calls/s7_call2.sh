#!/bin/bash
# Next session, device call 2 (seed-mix 27B generated on the device): measurements for issues 6, 10, 11.
#  - issue 6: the GEMV table at every shape of the issue, one run (with call 1's device test, issue 6
#    can then be resolved on its measured table and the limiting reasons in bench/NOTES.md);
#  - issue 11: per-kernel profiles of the step with f16 and tq3 caches (tq3 costs ~0.46 ms per token);
#  - issue 10: where a verify round's 19-20 ms go (GPU graph vs host), with and without gemv_mma.
F=Q8_0,Q4_0,Q5_0,IQ4_NL,IQ4_XS,Q4_K,Q5_K,Q6_K,Q2_K,Q3_K,IQ2_XXS,IQ2_XS,IQ2_S,IQ3_XXS,IQ3_S,TQ1_0,TQ2_0,Q1_0,Q2_0
exec bash bench/suite.sh 590 \
 "gemv|160|python3 bench/gemv.py --impls cu --formats $F --check-shapes kv --check-ns 1,8 --shapes ffn,attn,other --ns 1,8 --budget 140 --out \$D | tail -120" \
 "prof|200|for kv in f16 tq3; do for d in 0 32768; do python3 bench/step_profile.py --kv-type \$kv --depth \$d --out \$D | head -14; done; done" \
 "verify|150|python3 bench/verify_profile.py --ms 1,5,8 --out \$D && TIGHTFIT_GEMV_MMA=1 python3 bench/verify_profile.py --ms 5,8 --out \$D | tail -4"
