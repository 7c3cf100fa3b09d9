#!/bin/bash
# Session 16, device call 7. Carry [".whl", ".tcache_in", ".fixtures"].
# Call 6 measured the MTP plan's peak 244 MiB over total - reserve. The same placed 27B: plan without
# MTP and plain decoding, plan without MTP and the free synthetic drafter (the verify block's own
# memory), then MTP again.
P="python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --out \$D"
exec bash bench/suite.sh 300 \
 "plain|90|$P --mode plain 2>&1 | grep -v Warn | tail -4" \
 "synth|90|$P --mode synth 2>&1 | grep -v Warn | tail -4" \
 "mtp|90|$P --mode mtp 2>&1 | grep -v Warn | tail -4"
