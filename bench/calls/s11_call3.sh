#!/bin/bash
# Session 11, device call 3. Carry [".whl", ".tcache_in", ".fixtures"].
# The tensor-core GEMV with the deterministic stream-K fixup (no atomics, no memset):
#  1. prefill repeatability and step vs block with TIGHTFIT_GEMV_MMA=1 (bench/spec_exact.py);
#  2. the verify block's cost with and without it (bench/verify_profile.py --ms 5,8);
#  3. the speculative bench with it: forced acceptance 0 / 0.8 and the real drafters.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 560 \
 "exact|100|TIGHTFIT_GEMV_MMA=1 python3 bench/spec_exact.py --positions 8 > \$D/full.txt 2>&1; rc=\$?; tail -12 \$D/full.txt; exit \$rc" \
 "verify|170|for m in 1 0; do TIGHTFIT_GEMV_MMA=\$m python3 bench/verify_profile.py --ms 5,8 --out \$D/m\$m > \$D/m\$m.txt 2>&1; echo \"MMA=\$m\"; tail -3 \$D/m\$m.txt; done" \
 "spec|220|TIGHTFIT_GEMV_MMA=1 python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --max-tokens 512 --real-prompts repeat,prose --budget-s 200 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -14 \$D/full.txt; exit \$rc"
