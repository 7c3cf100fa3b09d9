#!/bin/bash
# Session 23, device call 5 (run inline on call 4's warm machine, twice: the first run's budget went to
# generating the copying 27B). Carry [".whl", ".tcache_in"].
# The copying 27B with the real drafters on the edit task: every speculative row must equal plain
# decoding with the merged GDN sites and the merged gates in the verify block.
export TIGHTFIT_DEVICE_EMBED=1
C='python3 bench/spec.py --copycat --n-ctx 4096 --force-accept "" --real-prompts edit --max-tokens 128 --max-draft 16 --budget-s 110 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -6; exit $rc'
exec bash bench/suite.sh 300 "copycat|280|$C"
