#!/bin/bash
# Session 15, device call 3. Carry [".whl", ".tcache_in", ".fixtures"].
# gemv_cuda's auto now runs the v2 bodies at NC = 2, 3 (tf_gemv3 from NC = 4; call 2 measured v3
# 10-37 % slower at NC = 2 on every wide shape). Device correctness of the CUDA GEMV, PDL chain and
# verify graph; verify blocks M = 2, 3, 5 with it and with TIGHTFIT_CU_AUTO_V3_MIN_NC=2 (the old
# rule, same machine); forced 80 % at k = 1, 2, 4.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 2,3,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph" $D/v.txt | head -8; exit $rc'
exec bash bench/suite.sh 570 \
 "tests|170|python3 -m pytest -q -x tests/test_gemv_cuda_device.py tests/test_pdl_device.py tests/test_verify_graph.py tests/test_spec_block.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -5" \
 "v4|90|$V" \
 "v3|80|TIGHTFIT_CU_AUTO_V3_MIN_NC=2 $V" \
 "spec|130|python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0.8 --synth-k 1,2,4 --max-tokens 512 --skip-real --budget-s 110 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -6"
