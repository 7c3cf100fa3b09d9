#!/bin/bash
# Session 19, device call 5 (final tree). Carry [".whl", ".tcache_in", ".fixtures"].
# Device tests; the verify block M = 5 (which inputs still take their own quantize launch); forced
# k = 4 at 0 / 80 %, fixed and with the policy; the placed 27B's peak against its plan with the
# synthetic drafter (verify region now replay inputs, not per-position states).
export TIGHTFIT_DEVICE_EMBED=1
V5='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|quantized|  5  " $D/v.txt | head -6; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 130 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -8; exit $rc'
exec bash bench/suite.sh 500 \
 "tests|120|python3 -m pytest -q tests/test_block_step_replay.py tests/test_verify_graph.py tests/test_spec_block.py tests/test_verify_placed.py 2>&1 | grep -E '^E  |passed|failed|Error' | cut -c1-400 | tail -8" \
 "on|45|$V5" \
 "spec|150|$S" \
 "peak|120|python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --mode synth --out \$D > \$D/full.txt 2>&1; tail -8 \$D/full.txt"
