#!/bin/bash
# Session 18, device call 8. Carry [".whl", ".tcache_in", ".fixtures"].
# The placed 27B's peak with the synthetic drafter forced, planned as serve --spec plans (a verify
# region of 5 tokens: the captured block), against call 7's plan without one (eager blocks).
exec bash bench/suite.sh 300 \
 "synth5|150|python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --mode synth --out \$D 2>&1 | grep -v Warn | tail -14" \
 "plain|100|python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --mode plain --out \$D 2>&1 | grep -v Warn | tail -4"
