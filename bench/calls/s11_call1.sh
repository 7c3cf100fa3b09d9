#!/bin/bash
# Session 11, device call 1. Carry [".whl", ".tcache_in", ".fixtures"].
#  1. bench/mma_bisect.py: two prefills per configuration (tensor-core GEMV off / on / on with a
#     sync after every GEMV / without PDL / without the pipe / one format at a time), then every
#     routed call of one prefill checked in place against gemv_cuda and itself;
#  2. the default path after the fp16 fix (s10_call12's steps 1-2): step vs verify block, prefill
#     repeatability, the speculative bench with the real drafters and forced acceptance;
#  3. spare: gemv_mma twice on the loaded tensors at N = 5.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 575 \
 "bisect|170|python3 bench/mma_bisect.py --out \$D > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt | tail -40; exit \$rc" \
 "exact|110|python3 bench/spec_exact.py --positions 16 --perturb 1e-7 > \$D/full.txt 2>&1; tail -22 \$D/full.txt" \
 "spec|220|python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --max-tokens 512 --real-prompts repeat,prose --budget-s 200 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -14 \$D/full.txt; exit \$rc" \
 "mma2|90|TIGHTFIT_GEMV_MMA=1 python3 bench/model_gemv_check.py --n 5 --layers 0,3 > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'twice|mma' | head -40"
