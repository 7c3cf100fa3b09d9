#!/bin/bash
# Session 13, device call 4. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 10 on the copycat 27B, after call 3:
#  1. forced 80 % at n_ctx 2048 (call 3 at 8192: 20.4 ms per round against 15.1 on the seed-mix
#     model at 2048: does the verify block's cost follow the context size rather than its length?);
#  2. real drafters on the copy / edit tasks with rounds that captured a graph kept out of the
#     policy's costs (model.onetime) and the split-mode graphs warmed (call 3: one 181 ms first
#     probe made drafting look hopeless), drafts up to 8, then up to 16 tokens.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 560 \
 "ctx2k|110|python3 bench/spec.py --copycat --n-ctx 2048 --forced-modes fixed --force-accept 0.8 --skip-real --max-tokens 256 --budget-s 100 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -3" \
 "cc8|220|python3 bench/spec.py --copycat --n-ctx 8192 --forced-modes fixed --force-accept 0.8 --real-prompts repeat,edit --max-tokens 256 --max-draft 8 --budget-s 200 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -8" \
 "cc16|170|python3 bench/spec.py --copycat --n-ctx 8192 --force-accept '' --real-prompts repeat,edit --max-tokens 256 --max-draft 16 --budget-s 150 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -6"
