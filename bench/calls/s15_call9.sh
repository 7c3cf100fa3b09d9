#!/bin/bash
# Session 15, device call 9. Carry [".whl", ".tcache_in", ".fixtures"].
# MTPHead.on_gpu_model with the block in bf16 (F.linear) and the executor's quantized LM head:
# forced 0 / 80 % with the head drafting 4 tokens, the real MTP drafter on free text (calls 7, 8: the
# fp32 block + bf16 head copy 0.90x, the raw-bytes block 0.68x at forced 80 %).
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 170 \
 "mtp|140|python3 bench/spec.py --seedmix --mtp --forced-modes fixed --forced-drafter mtp --force-accept 0,0.8 --synth-k 4 --max-tokens 256 --drafters mtp --real-prompts prose --repeat 1 --budget-s 125 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'MTP head|forced|real|total' | tail -6"
