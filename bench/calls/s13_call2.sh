#!/bin/bash
# Session 13, device call 2. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 10: the tensor-core GEMV's L2 prefetch of the next step (runtime distance TIGHTFIT_MMA_PF):
#  1. device tests of the GEMV (default pf = 1);
#  2. the verify block at pf = 0 / 1 / 2 / 3 (one process each: the distance is baked at capture);
#  3. session 11's arithmetic (TIGHTFIT_MMA_LEGACY=1, pf = 0) on the same machine, for the A/B.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
V="python3 bench/verify_profile.py --ms 5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -E 'step:|graph|tf_mma' \$D/v.txt | head -8; exit \$rc"
exec bash bench/suite.sh 580 \
 "tests|150|python3 -m pytest -q -x tests/test_gemv_mma_device.py tests/test_gemv_route_mma.py 2>&1 | grep -E '^E |passed|failed' | tail -6" \
 "pf0|120|TIGHTFIT_MMA_PF=0 $V" \
 "pf1|45|TIGHTFIT_MMA_PF=1 $V" \
 "pf2|45|TIGHTFIT_MMA_PF=2 $V" \
 "pf3|45|TIGHTFIT_MMA_PF=3 $V" \
 "legacy|170|TIGHTFIT_MMA_LEGACY=1 TIGHTFIT_MMA_PF=0 $V"
