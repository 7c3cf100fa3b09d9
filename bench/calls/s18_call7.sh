#!/bin/bash
# Session 18, device call 7. Carry [".whl", ".tcache_in", ".fixtures"].
# What the speculative loop allocates beside the arena on a placed 27B (mtp_peak --where: every
# allocation with a runtime/spec or verify_graph frame, by site).
exec bash bench/suite.sh 300 \
 "synth|240|python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --mode synth --where --out \$D 2>&1 | grep -v Warn | tail -45"
