#!/bin/bash
# Session 22, device call 6 (review). Carry [".whl", ".tcache_in"].
# Engine.generate's greedy fast path now calls GPUModel.greedy(tok, st, 1) (the step graph with its
# argmax inside, the id read from the ring) instead of the removed greedy_next: the copying 27B with
# the real drafters, every speculative row against those plain tokens, plain tok/s.
export TIGHTFIT_DEVICE_EMBED=1
C='python3 bench/spec.py --copycat --n-ctx 8192 --force-accept "" --real-prompts edit,quote,agent --max-tokens 256 --max-draft 16 --budget-s 130 --out $D > $D/full.txt 2>&1; rc=$?; grep -v Warn $D/full.txt | tail -8; exit $rc'
exec bash bench/suite.sh 230 "copycat|180|$C"
