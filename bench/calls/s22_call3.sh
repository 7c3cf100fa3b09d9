#!/bin/bash
# Session 22, device call 3. Carry [".whl", ".tcache_in"].
# Commits as captured graphs, the verify-graph support check cached, ids straight into the pinned
# buffer: device tests of the verify graph and the speculative path, then the forced rounds'
# anatomy again and the speedups in both readings of "80 %", fixed and with the policy.
export TIGHTFIT_DEVICE_EMBED=1
T='python3 -m pytest -q tests/test_verify_graph.py tests/test_block_step_replay.py tests/test_spec_block.py 2>&1 | grep -E "^E  |passed|failed|Error" | cut -c1-300 | tail -8'
S='TIGHTFIT_ROUND_TRACE=1 python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --force-as both --synth-k 4 --max-tokens 512 --skip-real --budget-s 250 --out $D > $D/full.txt 2>&1; rc=$?; grep -E "anatomy" $D/full.txt | cut -c1-260; grep -v Warn $D/full.txt | tail -9; exit $rc'
exec bash bench/suite.sh 560 "tests|200|$T" "spec|300|$S"
