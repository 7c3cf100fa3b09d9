#!/bin/bash
# Session 15, device call 8. Carry [".whl", ".tcache_in", ".fixtures"].
# The MTP head on the GPU executor now keeps its block as raw GGUF bytes (CUDA GEMV) and uses the
# executor's LM head (call 7, the old head: fp32 block + bf16 head copy, forced 80 % k = 4 0.90x).
# Device tests of the MTP head, then forced 0 / 80 % with the head drafting 4 tokens and the real
# MTP drafter on free text.
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 290 \
 "tests|60|python3 -m pytest -q -x tests/test_spec_mtp.py 2>&1 | grep -E '^E |passed|failed|Error' | tail -5" \
 "mtp|200|python3 bench/spec.py --seedmix --mtp --forced-modes fixed --forced-drafter mtp --force-accept 0,0.8 --synth-k 4 --max-tokens 256 --drafters mtp --real-prompts prose --repeat 1 --budget-s 185 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'MTP head|forced|real|total' | tail -6"
