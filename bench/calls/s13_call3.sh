#!/bin/bash
# Session 13, device call 3. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 10, the real drafters on repetitive tasks with a model that repeats: the copycat 27B
# (tightfit/model/copycat.py: the seed-mix tensors and types, an induction circuit, zeros elsewhere).
#  1. forced 80 % at k = 4 (plain tok/s must equal the seed-mix model's: same bytes per token) and
#     the real drafters (ngram, suffix) on the copy and edit tasks, twice each (rep 1: agent replay);
#  2. the same with drafts of up to 16 tokens;
#  3. the revised policy on the placed 8 GiB seed-mix model at forced 0 % (written for session 13).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 580 \
 "cc8|200|python3 bench/spec.py --copycat --n-ctx 8192 --forced-modes fixed --force-accept 0.8 --real-prompts repeat,edit --max-tokens 256 --max-draft 8 --budget-s 180 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -9" \
 "cc16|150|python3 bench/spec.py --copycat --n-ctx 8192 --force-accept '' --real-prompts repeat,edit --max-tokens 256 --max-draft 16 --budget-s 130 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -7" \
 "spec8g|200|python3 bench/spec.py --seedmix --vram 8GiB --forced-modes adaptive --force-accept 0 --max-tokens 128 --skip-real --budget-s 170 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -6"
