#!/bin/bash
# Session 18, device call 11. Carry [".whl", ".tcache_in", ".fixtures"].
# Every norm-produced gemv_mmh input packed (GDN qkv, attention q, FFN gate or up; commit 685e9eb,
# reverted in a2b62bd after this call measured it slower). The tree: device tests (gemv_mmh both kinds, the fused pack, the verify graph, speculation,
# the placed region); gemv_mmh per matrix; the 27B's verify block with the pack on / off; forced
# k = 4 at 0 % / 80 %.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph" $D/v.txt | head -4; exit $rc'
exec bash bench/suite.sh 580 \
 "tests|220|python3 -m pytest -q tests/test_gemv_mmh_device.py tests/test_gemv_mmh.py tests/test_kernels_fused_quant.py tests/test_verify_graph.py tests/test_spec_block.py tests/test_verify_placed.py tests/test_executor_buffers.py tests/test_plan_arena.py tests/test_gemv_route_mma.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -6" \
 "mmh|5|true" \
 "on|45|$V" \
 "off|45|TIGHTFIT_MMH_PACK=0 $V" \
 "spec|110|python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 90 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -4"
