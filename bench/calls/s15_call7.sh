#!/bin/bash
# Session 15, device call 7. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 10's "with and without each drafter": (1) the MTP head on the seed-mix 27B with its MTP block
# (--mtp): forced 0 / 80 % with the head drafting k = 2, 4 tokens (the mechanism's real cost), and
# the real MTP drafter on free text (random weights: nothing accepted, the policy's overhead);
# (2) the copying 27B with the n-gram drafter alone and the suffix drafter alone on the edit, quote and
# agent tasks (call 1 ran both together).
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 560 \
 "mtp|240|python3 bench/spec.py --seedmix --mtp --forced-modes fixed --forced-drafter mtp --force-accept 0,0.8 --synth-k 2,4 --max-tokens 512 --drafters mtp --real-prompts prose --repeat 2 --budget-s 220 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -9" \
 "ngram|140|python3 bench/spec.py --copycat --n-ctx 8192 --force-accept '' --drafters ngram --real-prompts edit,quote,agent --max-tokens 256 --max-draft 16 --budget-s 125 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -8" \
 "suffix|140|python3 bench/spec.py --copycat --n-ctx 8192 --force-accept '' --drafters suffix --real-prompts edit,quote,agent --max-tokens 256 --max-draft 16 --budget-s 125 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -8"
