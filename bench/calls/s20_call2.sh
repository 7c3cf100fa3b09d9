#!/bin/bash
# Session 20, device call 2. Carry [".whl", ".tcache_in", ".fixtures"].
# Call 1: the lean K4 epilogue cut Q5_K's step loop 964 -> 730 instructions (no spills) and the
# matrix time did not move (29.9 against 29.4 us): not issue-bound. Here the kernel variants that
# change what is in flight (one 16-row tile and two blocks per step; the cp.async ring at rt 2 /
# nst 2 and rt 1 / nst 3, now that the lean epilogue fits them), and where the forced round's time
# goes outside the verify block (every round's wall time; a host profile).
export TIGHTFIT_DEVICE_EMBED=1
V5='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "graph|M_Q5_K|M_Q4_K|M_Q6_K" $D/v.txt | head -5; exit $rc'
S='python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0.8 --synth-k 4 --max-tokens 512 --skip-real --budget-s 100 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | grep -E "round_wall|forced fixed" | cut -c1-200; grep -o "round_wall.*" $D/full.txt; exit $rc'
exec bash bench/suite.sh 560 \
 "rt1|80|TIGHTFIT_MMA_RT=1 $V5" \
 "p22|80|TIGHTFIT_MMA_PIPE=1 $V5" \
 "p13|80|TIGHTFIT_MMA_PIPE=1 TIGHTFIT_MMA_RT=1 TIGHTFIT_MMA_NST=3 $V5" \
 "spec|90|$S" \
 "prof|90|TIGHTFIT_BENCH_PROFILE=\$D/prof.txt $S; head -60 \$D/prof.txt"
