#!/bin/bash
# Session 16, device call 5. Carry [".whl", ".tcache_in", ".fixtures"].
# The tensor-core GEMV launched with PDL (wait before activations / workspace, signal after the
# main loop, tf_mma_rt's first steps prefetched into L2): device tests, then the M = 5 verify block
# with PDL + prefetch (default), PDL without prefetch (TIGHTFIT_MMA_PF=0) and without PDL
# (TIGHTFIT_MMA_PDL=0), same machine; forced 80 % k = 4 with the default.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 3,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph" $D/v.txt | head -8; exit $rc'
exec bash bench/suite.sh 560 \
 "tests|200|python3 -m pytest -q -x tests/test_gemv_mma_device.py tests/test_pdl_device.py tests/test_verify_graph.py tests/test_spec_block.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -5" \
 "pdl|70|$V" \
 "pf0|60|TIGHTFIT_MMA_PF=0 $V" \
 "off|60|TIGHTFIT_MMA_PDL=0 $V" \
 "spec|120|python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 100 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -4"
