#!/bin/bash
# Session 13, device call 5. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 10 on the copycat 27B with the bench's untimed warm runs (every block size's graph captured
# before timing) and drafts capped at 15 tokens (the skinny-GEMV block):
#  1. forced 80 % at k = 4, fixed and adaptive; forced 0 %, adaptive (the overhead bar);
#  2. real drafters on the copy / edit tasks with drafts up to 15 tokens (--max-draft 16, capped).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 470 \
 "forced|200|python3 bench/spec.py --copycat --n-ctx 8192 --forced-modes fixed,adaptive --force-accept 0,0.8 --skip-real --max-tokens 256 --budget-s 180 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -8" \
 "cc16|200|python3 bench/spec.py --copycat --n-ctx 8192 --force-accept '' --real-prompts repeat,edit --max-tokens 256 --max-draft 16 --budget-s 180 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -6"
