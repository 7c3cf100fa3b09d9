#!/bin/bash
# Session 20, device call 3. Carry [".whl", ".tcache_in", ".fixtures"].
# Q5_K now at one row tile per warp by default (call 2: 25.8 against 29.9 us in the M = 5 block),
# and the verify graph captures every block size of a mode with its first block (call 2: a capture
# inside the timed forced run put 0.28 s outside the rounds). Device tests; the block; the old
# epilogue at rt 1 (what the lean epilogue itself is worth); Q5_K per shape at rt 1 / 2 and N = 3..8
# (the route sends N >= 3 of the big matrices there); forced k = 4 at 0 / 80 %, fixed and policy.
export TIGHTFIT_DEVICE_EMBED=1
V5='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "graph|M_Q5_K|M_Q4_K" $D/v.txt | head -4; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 130 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -7; grep -o "round_wall[^}]*}" $D/full.txt; exit $rc'
exec bash bench/suite.sh 560 \
 "tests|130|python3 -m pytest -q tests/test_gemv_mma_device.py tests/test_verify_graph.py 2>&1 | grep -E '^E  |passed|failed|Error' | cut -c1-400 | tail -8" \
 "rt1|45|$V5" \
 "old_rt1|60|TIGHTFIT_MMA_MINS_TC=0 $V5" \
 "shapes|90|python3 bench/gemv.py --out \$D --impls mma --formats Q5_K --check-shapes '' --shapes ffn,attn --ns 3,4,5,8 --configs '[{\"rt\": 1}, {\"rt\": 2}]' > \$D/g.txt 2>&1; rc=\$?; tail -30 \$D/g.txt | cut -c1-160; exit \$rc" \
 "spec|160|$S"
