#!/bin/bash
# Session 10, device call 5 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 10, greedy identity
# on the 27B: call 4's spec runs differed from plain decoding (same = False) even with no accepted
# draft. Where the first token differs: plain twice on one state, forced r = 0 (every token from
# the verify block), the copy task twice; with the tensor-core GEMV (default) and without
# (TIGHTFIT_GEMV_MMA=0: the block's GEMVs on the dp4a kernels, as the step's).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 400 \
 "mma1|150|TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0 --max-tokens 256 --real-prompts repeat --budget-s 120 --out \$D > \$D/full.txt 2>&1; tail -7 \$D/full.txt" \
 "mma0|150|TIGHTFIT_GEMV_MMA=0 TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0 --max-tokens 256 --real-prompts repeat --budget-s 120 --out \$D > \$D/full.txt 2>&1; tail -7 \$D/full.txt"
