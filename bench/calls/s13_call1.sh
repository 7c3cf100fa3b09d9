#!/bin/bash
# Session 13, device call 1. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 10: the tensor-core GEMV without I2F (the mma's C carries the fp32 bias, scales built as
# fp32 bits, Q6_K's -32 folded into C), 32-bit split arithmetic, release arrivals:
#  1. its device tests (bitwise repeatability, against the reference);
#  2. the verify block A/B: TIGHTFIT_MMA_LEGACY=1 (session 11's arithmetic) then the new default;
#  3. the speculative bench, forced acceptance 0 / 0.8 at k = 4, GPU-resident 27B.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 560 \
 "tests|150|python3 -m pytest -q -x tests/test_gemv_mma_device.py tests/test_gemv_route_mma.py 2>&1 | grep -E '^E |passed|failed' | tail -6" \
 "vlegacy|70|TIGHTFIT_MMA_LEGACY=1 python3 bench/verify_profile.py --ms 1,5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -iE 'graph|step|IQ4|Q5_K|Q6_K|Q4_K|mma' \$D/v.txt | head -30; exit \$rc" \
 "vnew|60|python3 bench/verify_profile.py --ms 1,5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -iE 'graph|step|IQ4|Q5_K|Q6_K|Q4_K|mma' \$D/v.txt | head -30; exit \$rc" \
 "spec|160|python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --max-tokens 256 --skip-real --budget-s 140 --out \$D > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt | tail -12; exit \$rc"
