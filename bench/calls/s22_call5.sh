#!/bin/bash
# Session 22, device call 5. Carry [".whl", ".tcache_in"].
# Plain greedy decoding reads one id a token (GPUModel.greedy_next) instead of a row of logits, and
# the speculative loop's one-token rounds too: the forced rows in both readings, untraced, against
# the faster plain baseline; the copying 27B with the real drafters (its plain rows now take the
# fast path: every speculative row must still equal them).
export TIGHTFIT_DEVICE_EMBED=1
S='python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --force-as both --synth-k 4 --max-tokens 512 --skip-real --budget-s 200 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -10; grep -o "round_wall[^}]*}" $D/full.txt; exit $rc'
C='python3 bench/spec.py --copycat --n-ctx 8192 --force-accept "" --real-prompts edit,quote,agent --max-tokens 256 --max-draft 16 --budget-s 150 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -8; exit $rc'
exec bash bench/suite.sh 420 "spec|150|$S" "copycat|190|$C"
