#!/bin/bash
# Session 17, device call 14. Carry [".whl", ".tcache_in", ".fixtures"].
# The placed 27B's peak against its plan once the scratch line prices the cuBLAS workspace.
P="python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --out \$D"
exec bash bench/suite.sh 215 \
 "plain|100|$P --mode plain 2>&1 | grep -v Warn | tail -3" \
 "synth|90|$P --mode synth 2>&1 | grep -v Warn | tail -3"
