#!/bin/bash
# Session 19, device call 3. Carry [".whl", ".tcache_in", ".fixtures"].
# The replay test's diagnostic (which side leaves the float64-emulated update); GDN block kernel at
# BV 8, 1 warp; the verify block M = 1, 5; forced k = 4 at 0 / 80 %; the real drafters on the
# copying 27B (partial commits by replay: tokens must equal plain decoding).
export TIGHTFIT_DEVICE_EMBED=1
V1='python3 bench/verify_profile.py --ms 1,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|  [15]  " $D/v.txt | head -6; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 90 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -4; exit $rc'
exec bash bench/suite.sh 585 \
 "tests|100|python3 -m pytest -q tests/test_block_step_replay.py tests/test_verify_graph.py 2>&1 | grep -E '^E  |passed|failed|Error' | cut -c1-400 | tail -8" \
 "on|60|$V1" \
 "spec|100|$S" \
 "cc|250|python3 bench/spec.py --copycat --n-ctx 8192 --force-accept '' --real-prompts edit,quote,agent --max-tokens 256 --max-draft 16 --budget-s 220 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -12"
