#!/bin/bash
# Session 22, device call 4 (the final tree). Carry [".whl", ".tcache_in"].
# The forced rounds with the prep split (find / upload / event), both readings of "80 %"; the
# copying 27B with the real drafters (tokens against plain decoding, now with graph commits);
# the placed 27B's peak against its plan (the commit graphs must hold no memory).
export TIGHTFIT_DEVICE_EMBED=1
S='TIGHTFIT_ROUND_TRACE=1 python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --force-as both --synth-k 4 --max-tokens 512 --skip-real --budget-s 200 --out $D > $D/full.txt 2>&1; rc=$?; grep -E "anatomy" $D/full.txt | cut -c1-300; grep -v Warn $D/full.txt | tail -9; exit $rc'
C='python3 bench/spec.py --copycat --n-ctx 8192 --force-accept "" --real-prompts edit,quote,agent --max-tokens 256 --max-draft 16 --budget-s 150 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -8; exit $rc'
P='python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --mode synth --out $D > $D/full.txt 2>&1; rc=$?; tail -8 $D/full.txt; exit $rc'
exec bash bench/suite.sh 570 "spec|150|$S" "copycat|200|$C" "peak|140|$P"
