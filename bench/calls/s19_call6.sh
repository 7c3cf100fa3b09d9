#!/bin/bash
# Session 19, device call 6. Carry [".whl", ".tcache_in", ".fixtures"].
# tf_mma_rt (Q5_K, Q4_K) with an L2 bulk prefetch TIGHTFIT_MMA_PF steps ahead: the kernel's device
# tests at distance 2; the verify block M = 5 at distance 0 / 2 / 4; forced k = 4 at 80 % at 2.
export TIGHTFIT_DEVICE_EMBED=1
V5='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "graph|M_Q5_K|M_Q4_K" $D/v.txt | head -5; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 60 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -3; exit $rc'
exec bash bench/suite.sh 330 \
 "t|60|TIGHTFIT_MMA_PF=2 python3 -m pytest -q tests/test_gemv_mma_device.py -k 'rt or bitwise' 2>&1 | grep -E '^E  |passed|failed|Error' | tail -4" \
 "pf0|45|TIGHTFIT_MMA_PF=0 $V5" \
 "pf2|50|TIGHTFIT_MMA_PF=2 $V5" \
 "pf4|50|TIGHTFIT_MMA_PF=4 $V5" \
 "spec2|70|TIGHTFIT_MMA_PF=2 $S"
