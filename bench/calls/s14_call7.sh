#!/bin/bash
# Session 14, device call 7. Carry [".whl", ".tcache_in", ".fixtures"].
# Ran on 2a39c20 (TIGHTFIT_MMA_LEAN; removed in 53a6602).
# Issue 10, occupancy of the tensor-core GEMV (ncu, call 4: 3.4 warps per scheduler against the
# dp4a N = 1 kernel's 6.7; same instruction count within 14 %). TIGHTFIT_MMA_LEAN=1 makes the
# one-row-tile kernel step one block at a time: IQ4_XS then fits 64 registers without spills
# (offline nvcc), so TIGHTFIT_MMA_MINB=4 runs 8 warps per scheduler. Per matrix (rt 1) at MINB 3
# and 4 against the default (rt 2, MINB 2), then the verify block with every format at rt 1.
export TIGHTFIT_DEVICE_EMBED=1
G="python3 bench/gemv.py --impls mma --formats IQ4_XS,Q5_K,Q4_K,Q6_K --check-shapes '' --shapes ffn --ns 1,5 --budget 60 --out \$D"
P="python3 -c \"import json;[print(d['type'],d['n_in'],d['n_out'],d['N'],d['cfg'],round(d['us'],1)) for d in map(json.loads,open('\$D/gemv.jsonl')) if d.get('kind')=='time']\""
V='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|tf_m" $D/v.txt | head -7; exit $rc'
exec bash bench/suite.sh 500 \
 "base|80|$G > \$D/full.txt 2>&1; $P" \
 "lean4|80|TIGHTFIT_MMA_LEAN=1 TIGHTFIT_MMA_MINB=4 $G --configs '[{\"rt\":1}]' > \$D/full.txt 2>&1; $P" \
 "lean3|80|TIGHTFIT_MMA_LEAN=1 TIGHTFIT_MMA_MINB=3 $G --configs '[{\"rt\":1}]' > \$D/full.txt 2>&1; $P" \
 "v4|90|TIGHTFIT_MMA_LEAN=1 TIGHTFIT_MMA_MINB=4 TIGHTFIT_MMA_RT=1 $V" \
 "v3|90|TIGHTFIT_MMA_LEAN=1 TIGHTFIT_MMA_MINB=3 TIGHTFIT_MMA_RT=1 $V"
