#!/bin/bash
# Session 23, device call 3. Carry [".whl", ".tcache_in"].
# Every GDN site of the 27B now merges (merge.relayout's range ends at the last member's aligned slot:
# it was 64 bytes short, so qkv + gate and beta + alpha ran as four launches per layer in the step);
# the verify block runs beta + alpha as one product too, the GDN kernel reading its halves; tiny
# matrices take 8 warps per row. Device tests of the touched paths, the step and M = 5 per kernel,
# then the forced rows in both readings of "80 %".
export TIGHTFIT_DEVICE_EMBED=1
T='python3 -m pytest -q -x tests/test_block_step_replay.py tests/test_verify_graph.py tests/test_merge_linears.py -p no:cacheprovider 2>&1 | tail -5'
V='python3 bench/verify_profile.py --ms 1,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|^ *[15] " $D/v.txt | head -8; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --force-as both --synth-k 4 --max-tokens 512 --skip-real --budget-s 200 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -10; grep -o "round_wall[^}]*}" $D/full.txt; exit $rc'
exec bash bench/suite.sh 580 "tests|170|$T" "ms15|150|$V" "spec|230|$S"
