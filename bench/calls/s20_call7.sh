#!/bin/bash
# Session 20, device call 7 (the final tree, as call 4's). Carry [".whl", ".tcache_in", ".fixtures"].
# Forced k = 4 at 0 / 80 %, fixed and with the policy, on a second machine.
export TIGHTFIT_DEVICE_EMBED=1
S='python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 130 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -7; grep -o "round_wall[^}]*}" $D/full.txt; exit $rc'
exec bash bench/suite.sh 240 "spec|160|$S"
