#!/bin/bash
# Session 18, device call 6. Carry [".whl", ".tcache_in", ".fixtures"].
# The verify block's kernels at M = 1 and 5 (what costs more with the columns); the segments torch
# reserves beside the arena during a placed 27B's speculative rounds, with what made each.
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 500 \
 "prof|90|python3 bench/verify_profile.py --ms 1,5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -E 'step:|graph' \$D/v.txt | head -8; exit \$rc" \
 "synth|300|python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --mode synth --where --out \$D 2>&1 | grep -v Warn | tail -70"
