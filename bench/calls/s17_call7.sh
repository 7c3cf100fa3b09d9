#!/bin/bash
# Session 17, device call 7. Carry [".whl", ".tcache_in", ".fixtures"].
# gemv_mmh routed (IQ4_XS, 4..8 columns, matrices of >= 40 Mi weights): device tests, the 27B's
# verify block at M = 3, 5 with the route on and off (TIGHTFIT_GEMV_MMH=0), same machine; forced
# 0 % / 80 % at k = 4 with the route on.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 3,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph" $D/v.txt | head -8; exit $rc'
exec bash bench/suite.sh 560 \
 "tests|200|python3 -m pytest -q -x tests/test_gemv_mmh_device.py tests/test_gemv_mmh.py tests/test_verify_graph.py tests/test_spec_block.py tests/test_gemv_route_mma.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -5" \
 "on|70|$V" \
 "off|60|TIGHTFIT_GEMV_MMH=0 $V" \
 "spec|130|python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 100 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -4"
