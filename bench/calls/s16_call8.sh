#!/bin/bash
# Session 16, device call 8. Carry [".whl", ".tcache_in", ".fixtures"].
# Speculation on a placed 27B that fits whole on the GPU (--vram 24GiB: one arena, no host rows): its
# verify block runs eagerly (VerifyGraph refuses placed models). Forced 0 / 80 %, k = 4.
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 200 \
 "placed|170|python3 bench/spec.py --seedmix --vram 24GiB --forced-modes fixed --force-accept 0,0.8 --synth-k 4 --max-tokens 256 --skip-real --budget-s 150 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'forced|plain|total|Error|error' | tail -6"
