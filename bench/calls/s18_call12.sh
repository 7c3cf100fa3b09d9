#!/bin/bash
# Session 18, device call 12. Carry [".whl", ".tcache_in", ".fixtures"].
# add_rmsnorm's pairs stored contiguously (call 11: the scattered 2-byte stores made the norm 5.0 ->
# 8.6 us): device tests; the verify block with the pack on / off; forced k = 4.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph" $D/v.txt | head -4; exit $rc'
exec bash bench/suite.sh 215 \
 "tests|90|python3 -m pytest -q tests/test_gemv_mmh_device.py tests/test_kernels_fused_quant.py tests/test_verify_graph.py tests/test_spec_block.py tests/test_verify_placed.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -6" \
 "on|35|$V" \
 "off|25|TIGHTFIT_MMH_PACK=0 $V" \
 "spec|55|python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 45 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -3"
