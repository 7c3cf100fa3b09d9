#!/bin/bash
# Session 10, device call 12 (written, not run: the session's device time was spent). For the next
# session, carry [".whl", ".tcache_in", ".fixtures"] (refresh .tcache_in from the newest call).
#  1. the default path after the fp16 fix (tensor-core GEMV off): step vs verify block, prefill
#     repeatability (bench/spec_exact.py), then the speculative bench with the real drafters on the
#     copy task twice (rep 1: an agent replay) and forced acceptance;
#  2. the tensor-core GEMV run twice on the 27B's loaded tensors (bench/model_gemv_check.py): is the
#     12 % prefill difference with TIGHTFIT_GEMV_MMA=1 in the kernel or in how the model calls it?
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 560 \
 "exact|120|python3 bench/spec_exact.py --positions 16 --perturb 1e-7 > \$D/full.txt 2>&1; tail -22 \$D/full.txt" \
 "spec|220|python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --max-tokens 512 --real-prompts repeat,prose --budget-s 200 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -14 \$D/full.txt; exit \$rc" \
 "mma2|100|TIGHTFIT_GEMV_MMA=1 python3 bench/model_gemv_check.py --n 5 --layers 0,3 > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'cuda N|mma' | head -40"
