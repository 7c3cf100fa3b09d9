#!/bin/bash
# Session 20, device call 5. Carry [".whl", ".tcache_in", ".fixtures"].
# Measured slower (RESULTS session 20, call 5) and removed; the code is in 722e9e8.
# The stream-K fixup's reducer with two pieces' loads in flight (TF_MMA_RED_BATCH 8 floats per
# lane; its sum order unchanged) against one at a time (TIGHTFIT_MMA_RED_BATCH=0), same machine:
# the tensor-core GEMV tests, the block M = 5, forced k = 4 at 80 %.
export TIGHTFIT_DEVICE_EMBED=1
V5='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "graph|tf_m" $D/v.txt | head -6; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 100 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -3; grep -o "round_wall[^}]*}" $D/full.txt; exit $rc'
exec bash bench/suite.sh 400 \
 "tests|100|python3 -m pytest -q -x tests/test_gemv_mma_device.py tests/test_gemv_mmh_device.py 2>&1 | grep -E '^E  |passed|failed|Error' | cut -c1-400 | tail -8" \
 "red8|50|$V5" \
 "red0|50|TIGHTFIT_MMA_RED_BATCH=0 $V5" \
 "spec|90|$S"
