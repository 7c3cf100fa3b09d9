#!/bin/bash
# Session 11, device call 2. Carry [".whl", ".tcache_in", ".fixtures"].
#  1. host GEMV per batch width on the device host (bench/cpu_gemv_batch.py): the AVX-512
#     multi-column block code at B = 1, 2, 4, 5, 8 on cold copies;
#  2. speculative decoding on the seed-mix 27B placed under 8 GiB (host rows): plain vs forced
#     acceptance 0 / 0.8 at k = 4 (the verify block's host rows at M = 5).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 400 \
 "hostbatch|150|python3 bench/cpu_gemv_batch.py --copies 12 --reps 3 > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt; exit \$rc" \
 "spec8g|220|python3 bench/spec.py --seedmix --vram 8GiB --forced-modes fixed,adaptive --force-accept 0,0.8 --max-tokens 48 --skip-real --budget-s 190 --out \$D > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt | tail -14; exit \$rc"
