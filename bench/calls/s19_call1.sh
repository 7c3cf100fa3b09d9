#!/bin/bash
# Session 19, device call 1. Carry [".whl", ".tcache_in", ".fixtures"].
# The GDN rollback by replay (no per-position states), the conv kernel's token grid, every
# gemv_mmh input packed by its norm (contiguous pair stores): device tests; the recurrent kernels
# alone per configuration; gemv_mmh on the attention gate's shape; the 27B's verify block M = 1, 5
# (pack on / off); forced k = 4 at 0 % / 80 %.
export TIGHTFIT_DEVICE_EMBED=1
V1='python3 bench/verify_profile.py --ms 1,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|  [15]  " $D/v.txt | head -6; exit $rc'
V5='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|  [15]  " $D/v.txt | head -6; exit $rc'
exec bash bench/suite.sh 585 \
 "tests|200|python3 -m pytest -q tests/test_block_step_replay.py tests/test_kernels_fused_quant.py tests/test_verify_graph.py tests/test_verify_placed.py tests/test_spec_block.py tests/test_gemv_mmh_device.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -6" \
 "gdn|50|python3 bench/gdn_block.py --out \$D | tail -16" \
 "mmh|40|python3 bench/mmh.py --out \$D --shapes 5120x6144,5120x10240 --ns 1,5 --check-ns 5 | tail -8" \
 "on|60|$V1" \
 "off|45|TIGHTFIT_MMH_PACK=0 $V5" \
 "spec|110|python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 90 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -4"
