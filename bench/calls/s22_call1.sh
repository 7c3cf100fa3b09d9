#!/bin/bash
# Session 22, device call 1 (cold: no Triton cache left). Carry [".whl"].
# M = 1 against M = 5 per kernel (where the verify block's extra 4.6 ms sits outside the GEMVs),
# then forced k = 4 at 0 / 80 % in both readings of "80 %" (--force-as both), fixed and with the policy.
export TIGHTFIT_DEVICE_EMBED=1
V15='python3 bench/verify_profile.py --ms 1,5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph" $D/v.txt | head -4; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --force-as both --synth-k 4 --max-tokens 512 --skip-real --budget-s 260 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -9; grep -o "round_wall[^}]*}" $D/full.txt; exit $rc'
exec bash bench/suite.sh 580 "ms15|240|$V15" "spec|300|$S"
