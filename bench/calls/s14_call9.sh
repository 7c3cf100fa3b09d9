#!/bin/bash
# Session 14, device call 9. Carry [".whl", ".tcache_in", ".fixtures"].
# Ran on 1a45885 (TF_MMA_PF_L1; removed in a9a47d4).
# Issue 10: tf_mma_rt prefetches its next block into L1 (CCTL.E.PF1; call 8's source counters put
# 18 % of all stall samples on the first use of a step's weight words). A/B on one machine:
# TIGHTFIT_MMA_PF_L1=1 (default) against 0, the verify block and per matrix; the GEMV device tests.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|tf_m" $D/v.txt | head -7; exit $rc'
G="python3 bench/gemv.py --impls mma --formats IQ4_XS,Q5_K,Q4_K --check-shapes '' --shapes ffn --ns 1,5 --budget 40 --out \$D"
P="python3 -c \"import json;[print(d['type'],d['n_in'],d['n_out'],d['N'],round(d['us'],1)) for d in map(json.loads,open('\$D/gemv.jsonl')) if d.get('kind')=='time']\""
exec bash bench/suite.sh 330 \
 "pf1|60|$V" \
 "pf0|70|TIGHTFIT_MMA_PF_L1=0 $V" \
 "pf1b|40|$V" \
 "g1|45|$G > \$D/full.txt 2>&1; $P" \
 "g0|50|TIGHTFIT_MMA_PF_L1=0 $G > \$D/full.txt 2>&1; $P" \
 "tests|90|python3 -m pytest -q -x tests/test_gemv_mma_device.py -k 'shapes or bitwise' 2>&1 | grep -E '^E |passed|failed|Error' | tail -6"
