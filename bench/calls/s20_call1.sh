#!/bin/bash
# Session 20, device call 1. Carry [".whl", ".tcache_in", ".fixtures"].
# Q4_K / Q5_K's lean epilogue (the min term as one tf32 product per block, ws * dot in one FFMA):
# the tensor-core GEMV device tests, then the verify block M = 5 with it and without it
# (TIGHTFIT_MMA_MINS_TC=0, session 19's epilogue) on the same machine, then forced k = 4.
export TIGHTFIT_DEVICE_EMBED=1
V5='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "graph|M_Q5_K|M_Q4_K" $D/v.txt | head -5; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 100 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -6; exit $rc'
exec bash bench/suite.sh 540 \
 "tests|150|python3 -m pytest -q -x tests/test_gemv_mma_device.py 2>&1 | grep -E '^E  |passed|failed|Error' | cut -c1-400 | tail -8" \
 "lean|70|$V5" \
 "old|70|TIGHTFIT_MMA_MINS_TC=0 $V5" \
 "spec|130|$S"
