#!/bin/bash
# Session 23, device call 4. Carry [".whl", ".tcache_in"].
# Device tests of call 3's tree (its test step ran out of time before printing). Only that: failed
# machine requests had eaten most of the session's device time.
T='python3 -m pytest -q -x tests/test_block_step_replay.py tests/test_verify_graph.py tests/test_merge_linears.py -p no:cacheprovider -rs'
exec bash bench/suite.sh 200 "tests|170|$T"
