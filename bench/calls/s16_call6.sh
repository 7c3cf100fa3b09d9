#!/bin/bash
# Session 16, device call 6. Carry [".whl", ".tcache_in", ".fixtures"].
# The plan made with MTP against the measured peak (bench/mtp_peak.py, placed 27B, drafting forced);
# the MTP drafter at forced 80 % with the policy on (drafts up to 4, the policy picks the length).
exec bash bench/suite.sh 420 \
 "peak|200|python3 bench/mtp_peak.py --vram 24GiB --ctx 4096 --tokens 96 --out \$D 2>&1 | grep -v Warn | tail -16" \
 "policy|180|TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec.py --seedmix --mtp --forced-modes adaptive --forced-drafter mtp --force-accept 0.8 --synth-k 4 --max-tokens 256 --drafters mtp --skip-real --budget-s 150 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'MTP |forced|total|Error|error' | tail -6"
