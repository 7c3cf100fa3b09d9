#!/bin/bash
# Session 14, device call 3. Carry [".whl", ".tcache_in", ".fixtures"].
# Ran on 13c9ec9 (the deferred arrival and the bulk kernel, off by default; removed in b153df0).
# Issue 10: the fixup's first-group arrival no longer waits for its old count (tf_mma_finish,
# more = true; tf_mma_settle after the warp's loop). Session 11 measured the deterministic fixup at
# ~2 ms of the M = 5 verify block (14.88 against 12.80 with atomics).
#  1. the GEMV device tests (not the bulk ones: call 2 ran those); 2. the verify block;
#  3. per matrix at N = 5; 4. forced 80 % at k = 4 on the seed-mix model (512 tokens).
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 580 \
 "tests|200|python3 -m pytest -q -x tests/test_gemv_mma_device.py tests/test_gemv_route_mma.py -k 'not bulk' 2>&1 | grep -E '^E |passed|failed|Error' | tail -8" \
 "v|70|python3 bench/verify_profile.py --ms 1,5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -E 'step:|graph|tf_m' \$D/v.txt | head -12; exit \$rc" \
 "gemv|60|python3 bench/gemv.py --impls mma --formats IQ4_XS,Q5_K,Q6_K --check-shapes '' --shapes ffn --ns 1,5 --configs '[{\"bulk\":0}]' --budget 40 --out \$D > \$D/full.txt 2>&1; python3 -c \"import json;[print(d['type'],d['n_in'],d['n_out'],d['N'],d['cfg'],round(d['us'],1)) for d in map(json.loads,open('\$D/gemv.jsonl')) if d.get('kind')=='time']\"" \
 "spec|200|python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --max-tokens 512 --skip-real --budget-s 170 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -12"
