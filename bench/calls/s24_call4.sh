#!/bin/bash
# Session 24, device call 4. Carry [".whl", ".tcache_in"].
# The final tree: every tensor-core GEMV format's device tests (the module now compiles with the
# dp4a formats and the IQ tables in its translation unit), the step kernels and routing on the
# GPU; then the forced rows again on this machine.
export TIGHTFIT_DEVICE_EMBED=1
T='python3 -m pytest -q tests/test_gemv_mma_device.py tests/test_kernels_step.py tests/test_gemv_route_mma.py tests/test_merge_linears.py -p no:cacheprovider 2>&1 | tail -4'
S='python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --force-as both --synth-k 4 --max-tokens 512 --skip-real --budget-s 170 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -12; exit $rc'
exec bash bench/suite.sh 440 "tests|220|$T" "spec|190|$S"
