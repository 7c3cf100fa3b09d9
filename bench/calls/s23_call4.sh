#!/bin/bash
# Session 23, device call 4. Carry [".whl", ".tcache_in"].
# Device tests of call 3's tree (its test step ran out of time before printing), then the copying 27B
# with the real drafters on the edit task: every speculative row must equal plain decoding with the
# merged GDN sites. (Short: failed machine requests had eaten most of the session's device time.)
export TIGHTFIT_DEVICE_EMBED=1
T='python3 -m pytest -q -x tests/test_block_step_replay.py tests/test_verify_graph.py tests/test_merge_linears.py tests/test_spec_block.py -p no:cacheprovider -rs'
C='python3 bench/spec.py --copycat --n-ctx 4096 --force-accept "" --real-prompts edit --max-tokens 128 --max-draft 16 --budget-s 80 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -6; exit $rc'
exec bash bench/suite.sh 310 "tests|190|$T" "copycat|110|$C"
