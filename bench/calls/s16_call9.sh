#!/bin/bash
# Session 16, device call 9. Carry [".whl", ".tcache_in", ".fixtures"].
# Call 8: a placed 27B with no host rows verified eagerly, 0.04x / 0.14x at forced 0 / 80 %. Now its
# plan prices the captured verify block (batch 9: the `verify` region) and VerifyGraph runs there.
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 230 \
 "placed|200|python3 bench/spec.py --seedmix --vram 24GiB --forced-modes fixed --force-accept 0,0.8 --synth-k 4 --max-tokens 256 --skip-real --budget-s 170 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'forced|plain|total|Error|error' | tail -6"
