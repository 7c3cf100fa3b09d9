#!/bin/bash
# Session 18, device call 4 (call 3 again: a Triton 3.6 compile error fixed). Carry [".whl", ".tcache_in", ".fixtures"].
# The FFN's gate / up on gemv_mmh kind "foldp" (the norm writes their input as bf16 pairs):
# device tests; the 27B's verify block with the pack on / off (TIGHTFIT_MMH_PACK=0); forced k = 4.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 3,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph" $D/v.txt | head -8; exit $rc'
exec bash bench/suite.sh 560 \
 "tests|200|python3 -m pytest -q tests/test_gemv_mmh_device.py tests/test_kernels_fused_quant.py tests/test_verify_graph.py tests/test_spec_block.py tests/test_verify_placed.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -6" \
 "on|60|$V" \
 "off|50|TIGHTFIT_MMH_PACK=0 $V" \
 "spec|110|python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 90 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -4"
