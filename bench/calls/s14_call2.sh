#!/bin/bash
# Session 14, device call 2. Carry [".whl", ".tcache_in", ".fixtures"].
# Ran on 13c9ec9's bulk kernel without its deferred fixup arrival (both removed in b153df0).
# Issue 10: call 1 measured the bulk-staged GEMV (8 warps, 128 registers) 3-20 % SLOWER than
# tf_mma_rt: both are issue-bound at ~0.45 IPC with 4 warps per scheduler. The bulk ring frees the
# registers that held loads in flight, so it can run more warps: sb 2 (4 warps per CTA) at 4-5
# CTAs per SM (96-128 registers), against tf_mma_rt at its MINB=3 (80 registers, spills).
#  1. device tests of the new shapes; 2. per matrix (FFN shapes, N = 1, 5); 3. the verify block.
export TIGHTFIT_DEVICE_EMBED=1
CFGS='[{"bulk":0},{"bulk":1,"nst":2,"sb":2,"minb":4},{"bulk":1,"nst":2,"sb":2,"minb":5},{"bulk":1,"nst":3,"sb":2,"minb":3}]'
exec bash bench/suite.sh 570 \
 "tests|150|python3 -m pytest -q -x tests/test_gemv_mma_device.py -k 'bulk and not nst2-sb4' 2>&1 | grep -E '^E |passed|failed|Error' | tail -8" \
 "gemv|150|python3 bench/gemv.py --impls mma,cu --formats IQ4_XS,Q5_K,Q6_K --check-shapes '' --shapes ffn --ns 1,5 --configs '$CFGS' --budget 120 --out \$D > \$D/full.txt 2>&1; python3 -c \"import json;[print(d['type'],d['n_in'],d['n_out'],d['N'],d['impl'],d['cfg'],round(d['us'],1)) for d in map(json.loads,open('\$D/gemv.jsonl')) if d.get('kind')=='time']\"" \
 "minb3|70|TIGHTFIT_MMA_MINB=3 python3 bench/gemv.py --impls mma --formats IQ4_XS,Q5_K --check-shapes '' --shapes ffn --ns 5 --configs '[{\"bulk\":0}]' --budget 50 --out \$D > \$D/full.txt 2>&1; python3 -c \"import json;[print(d['type'],d['n_in'],d['n_out'],d['N'],d['cfg'],round(d['us'],1)) for d in map(json.loads,open('\$D/gemv.jsonl')) if d.get('kind')=='time']\"" \
 "v5|90|TIGHTFIT_MMA_BULK=1 TIGHTFIT_MMA_BULK_SB=2 TIGHTFIT_MMA_BULK_MINB=5 python3 bench/verify_profile.py --ms 5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -E 'step:|graph|tf_m' \$D/v.txt | head -8; exit \$rc" \
 "v4|90|TIGHTFIT_MMA_BULK=1 TIGHTFIT_MMA_BULK_SB=2 TIGHTFIT_MMA_BULK_MINB=4 python3 bench/verify_profile.py --ms 5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -E 'step:|graph|tf_m' \$D/v.txt | head -8; exit \$rc"
