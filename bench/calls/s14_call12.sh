#!/bin/bash
# Session 14, device call 12. Carry [".whl", ".tcache_in", ".fixtures"].
# Ran on 0e8f1eb (MMA_MIN_N_BY_SIZE).
# Issue 10: size-aware routing (gemv_route.MMA_MIN_N_BY_SIZE, call 11's crossovers): small matrices
# stay on gemv_cuda at N <= 8. Verify blocks M = 2, 3, 5 with it and with TIGHTFIT_MMA_BY_SIZE=0
# (same machine), then forced acceptance on the seed-mix model, and the routing / verify tests.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 2,3,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph" $D/v.txt | head -8; tail -5 $D/v.txt; exit $rc'
exec bash bench/suite.sh 330 \
 "v1|80|$V" \
 "v0|70|TIGHTFIT_MMA_BY_SIZE=0 $V" \
 "spec|120|python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --max-tokens 512 --skip-real --budget-s 100 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -9" \
 "tests|50|python3 -m pytest -q -x tests/test_gemv_route_mma.py tests/test_verify_graph.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -5"
