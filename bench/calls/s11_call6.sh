#!/bin/bash
# Session 11, device call 6. Carry [".whl", ".tcache_in", ".fixtures"].
# The final fixup (arrival as each split group completes, fence.acq_rel + relaxed atomics, serial
# fixed-order reduce) with the tensor-core GEMV ON BY DEFAULT (no TIGHTFIT_GEMV_MMA set):
#  1. its device tests; 2. prefill repeatability and step vs block on the 27B; 3. the verify block's
#  cost; 4. the speculative bench (forced acceptance, real drafters on the copy task).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
unset TIGHTFIT_GEMV_MMA
exec bash bench/suite.sh 420 \
 "tests|120|python3 -m pytest -q -x tests/test_gemv_mma_device.py tests/test_gemv_route_mma.py 2>&1 | tail -2" \
 "exact|70|python3 bench/spec_exact.py --positions 4 > \$D/full.txt 2>&1; rc=\$?; tail -8 \$D/full.txt; exit \$rc" \
 "verify|50|python3 bench/verify_profile.py --ms 5,8 --out \$D > \$D/v.txt 2>&1; tail -3 \$D/v.txt" \
 "spec|150|python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --max-tokens 512 --real-prompts repeat --budget-s 130 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -10 \$D/full.txt; exit \$rc"
