#!/bin/bash
# Session 19, device call 4. Carry [".whl", ".tcache_in", ".fixtures"].
# The verify block's in-graph argmax and single read (no sync before the block): device tests;
# the verify block M = 1, 5 (forward_block's host share); forced k = 4 at 0 / 80 %; the real
# drafters on the copying 27B (tokens must equal plain decoding).
export TIGHTFIT_DEVICE_EMBED=1
V1='python3 bench/verify_profile.py --ms 1,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|  [15]  " $D/v.txt | head -6; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 90 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -4; exit $rc'
exec bash bench/suite.sh 585 \
 "tests|170|python3 -m pytest -q tests/test_block_step_replay.py tests/test_verify_graph.py tests/test_spec_block.py tests/test_verify_placed.py tests/test_spec_mtp_graph.py tests/test_kernels_fused_quant.py tests/test_gemv_mmh.py 2>&1 | grep -E '^E  |passed|failed|Error' | cut -c1-400 | tail -8" \
 "on|60|$V1" \
 "spec|100|$S" \
 "cc|200|python3 bench/spec.py --copycat --n-ctx 8192 --force-accept '' --real-prompts edit,agent --max-tokens 256 --max-draft 16 --budget-s 170 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -8"
