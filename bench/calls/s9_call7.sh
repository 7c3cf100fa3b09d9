#!/bin/bash
# Session 9, device call 7 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 10: the verify block
# with the tensor-core GEMV on its N = 3..16 matrices (TIGHTFIT_GEMV_MMA=1, opt-in since session 5)
# against the default dp4a kernels, in one process each, and the forced-acceptance bench with it.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 300 \
 "verify|120|for g in 0 1; do mkdir -p \$D/m\$g; TIGHTFIT_GEMV_MMA=\$g python3 bench/verify_profile.py --ms 5,8 --out \$D/m\$g > \$D/m\$g.txt 2>&1; echo \"mma \$g\"; tail -3 \$D/m\$g.txt; grep -iE 'gemv|mma' \$D/m\$g.txt | sort -k3 -n -r | head -8; done" \
 "spec|100|TIGHTFIT_GEMV_MMA=1 TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec.py --seedmix --skip-real --forced-modes fixed --budget-s 80 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -5 \$D/full.txt; exit \$rc"
