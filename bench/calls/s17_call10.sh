#!/bin/bash
# Session 17, device call 10. Carry [".whl", ".tcache_in", ".fixtures"].
# The final tree: device tests (gemv_mmh, the verify graph and its placed region, speculation, the
# arena), the 27B's verify block with gemv_mmh on and off, forced 0 % / 80 % at k = 4, and the
# placed 27B's measured peak against its plan now that the scratch line is not an arena region.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 3,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph" $D/v.txt | head -8; exit $rc'
P="python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --out \$D"
exec bash bench/suite.sh 590 \
 "tests|210|python3 -m pytest -q tests/test_gemv_mmh_device.py tests/test_gemv_mmh.py tests/test_verify_graph.py tests/test_spec_block.py tests/test_verify_placed.py tests/test_executor_buffers.py tests/test_plan_arena.py tests/test_spec_mtp_graph.py tests/test_gemv_route_mma.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -6" \
 "on|60|$V" \
 "off|50|TIGHTFIT_GEMV_MMH=0 $V" \
 "spec|100|python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 80 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -4" \
 "plain|90|$P --mode plain 2>&1 | grep -v Warn | tail -4" \
 "synth|80|$P --mode synth 2>&1 | grep -v Warn | tail -4"
