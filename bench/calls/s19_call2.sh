#!/bin/bash
# Session 19, device call 2. Carry [".whl", ".tcache_in", ".fixtures"].
# The replay test with M unspecialised; the recurrent kernels per configuration; the attention
# gate on foldp (packed from 24 Mi weights); the verify block M = 1, 5; forced k = 4 at 0 / 80 %;
# the host's time per function in plain and speculative rounds (cProfile).
export TIGHTFIT_DEVICE_EMBED=1
V1='python3 bench/verify_profile.py --ms 1,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|  [15]  " $D/v.txt | head -6; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 90 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -4; exit $rc'
exec bash bench/suite.sh 585 \
 "tests|150|python3 -m pytest -q tests/test_block_step_replay.py tests/test_verify_graph.py tests/test_gemv_mmh.py tests/test_spec_block.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -6" \
 "gdn|60|python3 bench/gdn_block.py --out \$D | tail -20" \
 "on|60|$V1" \
 "spec|100|$S" \
 "prof|120|TIGHTFIT_BENCH_PROFILE=\$D/prof.txt python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0.8 --synth-k 4 --max-tokens 256 --skip-real --budget-s 100 > \$D/full.txt 2>&1; grep -A22 '==== ' \$D/prof.txt | cut -c1-150 | head -80"
