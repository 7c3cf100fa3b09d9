#!/bin/bash
# Session 22, device call 2. Carry [".whl", ".tcache_in"] (call 1's Triton cache).
# Where a round's ~0.9 ms outside its verify graph goes: graph launch cost against node count
# (synthetic graphs, the 27B's step and verify graphs), the plain token's pieces, and the forced
# rounds' anatomy (TIGHTFIT_ROUND_TRACE=1: host steps and the device's gap between graphs).
export TIGHTFIT_DEVICE_EMBED=1
G='python3 bench/graph_launch.py --out $D > $D/g.txt 2>&1; rc=$?; grep -v Warn $D/g.txt | tail -22; exit $rc'
S='TIGHTFIT_ROUND_TRACE=1 python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0.8 --force-as both --synth-k 4 --max-tokens 512 --skip-real --budget-s 200 --out $D > $D/full.txt 2>&1; rc=$?; grep -E "anatomy|forced fixed|plain" $D/full.txt | tail -8; exit $rc'
exec bash bench/suite.sh 500 "launch|200|$G" "spec|260|$S"
