#!/bin/bash
# Session 24, device call 2. Carry [".whl", ".tcache_in"].
# The grid formats routed to the tensor-core ring from 5 columns (gemv_mma_iq.cuh, no I2F in their
# scales); the verify block runs ffn_gate + ffn_up as one launch where the step merged them (the
# SwiGLU reads the halves of each row). Device tests of the touched paths, the step and M = 5 per
# kernel, then the forced rows in both readings of "80 %".
export TIGHTFIT_DEVICE_EMBED=1
T='python3 -m pytest -q -x tests/test_verify_graph.py tests/test_kernels_fused_quant.py tests/test_kernels_step.py -p no:cacheprovider 2>&1 | tail -5'
V='python3 bench/verify_profile.py --ms 1,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|^ *[15] " $D/v.txt | head -8; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --force-as both --synth-k 4 --max-tokens 512 --skip-real --budget-s 200 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -12; grep -o "round_wall[^}]*}" $D/full.txt; exit $rc'
exec bash bench/suite.sh 585 "tests|150|$T" "ms15|130|$V" "spec|250|$S"
