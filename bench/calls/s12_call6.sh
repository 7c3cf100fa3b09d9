#!/bin/bash
# Session 12, device call 6. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 5's headline bench with the new default (host rows split 0.4 GPU-over-PCIe / 0.6 CPU):
# planned vs measured VRAM, RSS, decode tok/s and roofline at 12 and 8 GiB, host profile.
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 500 \
 "plan|440|python3 bench/plan_vram.py --budgets 12GiB,8GiB --tokens 16 --profile-tokens 6 --profile-threads 0 --out \$D > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt | grep -E 'tok/s|roofline|GiB|host profile|kernel-only' | tail -16; exit \$rc"
