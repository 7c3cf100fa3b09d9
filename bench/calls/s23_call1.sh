#!/bin/bash
# Session 23, device call 1 (cold). Carry [".whl", ".tcache_in"].
# The step graph, M = 1 and M = 5 verify graphs per kernel, each with its first replay's kernels in
# launch order (which op of the pass costs what at five columns), then the device tests of the
# speculative path as a baseline for this session's changes.
export TIGHTFIT_DEVICE_EMBED=1
V15='python3 bench/verify_profile.py --ms 1,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|^ *[15] " $D/v.txt | head -8; exit $rc'
exec bash bench/suite.sh 560 "ms15|420|$V15"
