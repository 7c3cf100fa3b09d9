#!/bin/bash
# Session 17, device call 13. Carry [".whl", ".tcache_in", ".fixtures"].
# Where the placed 27B's memory beside the arena comes from (call 10: +14 MiB over total - reserve
# plain, +68 MiB with the synthetic drafter): allocation stacks of every block outside the arena.
P="python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --where --out \$D"
exec bash bench/suite.sh 300 \
 "synth|150|$P --mode synth 2>&1 | grep -v Warn | tail -32"
