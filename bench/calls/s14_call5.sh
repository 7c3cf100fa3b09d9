#!/bin/bash
# Session 14, device call 5 (written in session 13 as s14_call2.sh, run as call 5). Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 10's overhead bar on the placed 8 GiB model: the policy now trusts a single round sample of at
# most 8 plain steps (rounds that captured a graph give none), so it stops after two probes where
# drafting cannot pay (modelled: 20.6 % of a 48-round request, was 41 %; session 13 call 3
# measured 0.85x on the first 128-token request with four probes).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 560 \
 "spec8g|330|python3 bench/spec.py --seedmix --vram 8GiB --forced-modes adaptive --force-accept 0 --max-tokens 128 --skip-real --budget-s 300 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -6" \
 "cc|200|python3 bench/spec.py --copycat --n-ctx 8192 --forced-modes adaptive --force-accept 0 --real-prompts edit --max-tokens 256 --max-draft 16 --budget-s 180 --out \$D > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | tail -6"
