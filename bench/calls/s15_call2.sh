#!/bin/bash
# Session 15, device call 2. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 10: (1) the dp4a GEMV's variants at N = 2, 3, 5 on every shape of the verify block: a
# 2-token block costs +4.5 ms over the step (session 15 call 1), its GEMVs ~1.6x the N = 1 kernel;
# does any existing variant (v2: two-phase U = 4 at NC <= 2; v2h; v3: x in shared memory; v4)
# do better than auto's v3 / v4? (2) the policy with an 8-token cap at r = 0.8 / 0.9 (call 1's
# fixed rows put k = 6-8 ahead of k = 4 there).
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 560 \
 "cuvar|250|python3 bench/gemv.py --impls cu --formats IQ4_XS,Q5_K,Q6_K,Q4_K --check-shapes '' --shapes ffn,attn,other --ns 2,3,5 --configs '[{}, {\"kern\": \"v2\"}, {\"kern\": \"v2h\"}, {\"kern\": \"v3\"}, {\"kern\": \"v4\"}]' --budget 230 --out \$D > \$D/full.txt 2>&1; tail -75 \$D/full.txt" \
 "adapt8|200|python3 bench/spec.py --seedmix --forced-modes adaptive --force-accept 0.8,0.9 --synth-k 8 --max-tokens 512 --skip-real --budget-s 180 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -7"
