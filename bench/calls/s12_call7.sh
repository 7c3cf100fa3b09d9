#!/bin/bash
# Session 12, device calls 7 and 8 (8: after the policy revision). Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 10: the speculation policy's new exploration (first block of probe_k tokens, plain step
# measured next, a second probe length, no probes where drafting cannot pay) on the GPU-resident
# 27B: forced 0 % (overhead bar: >= 0.90x) and 80 % at k = 4, adaptive, 256 tokens.
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 330 \
 "spec|290|python3 bench/spec.py --seedmix --forced-modes adaptive --force-accept 0,0.8 --max-tokens 256 --skip-real --budget-s 220 --out \$D > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt | tail -8; exit \$rc"
