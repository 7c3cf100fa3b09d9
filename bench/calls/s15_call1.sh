#!/bin/bash
# Session 15, device call 1. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 10's benchmark as the issue words it: the speedup as a function of the forced acceptance
# rate (r = 0 .. 1, k = 2, 4, 8; stratified per-round draws, tightfit/runtime/spec/forced.py), the
# policy at r = 0 and 0.8, and the real drafters on the copying model on every repetitive task
# (edit, summarise with quotes, a two-turn agent conversation) and on free-form text.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 570 \
 "sweep|230|python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0,0.5,0.7,0.8,0.9,1 --synth-k 2,4,8 --max-tokens 512 --skip-real --budget-s 210 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -22" \
 "adapt|80|python3 bench/spec.py --seedmix --forced-modes adaptive --force-accept 0,0.8 --max-tokens 512 --skip-real --budget-s 70 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -7" \
 "cc|230|python3 bench/spec.py --copycat --n-ctx 8192 --force-accept '' --real-prompts edit,quote,agent,prose --max-tokens 256 --max-draft 16 --budget-s 210 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -12"
