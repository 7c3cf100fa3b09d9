#!/bin/bash
# Session 10, device call 1 (carry [".whl", ".tcache_in", ".fixtures"]).
#  - issue 10: the cp.async-pipelined tensor-core GEMV (gemv_mma_pipe.cuh): device tests, then the
#    per-matrix sweep against tf_mma_rt at N = 1 / 5 / 8 (ring depth 2 / 3, one / two row tiles),
#    and the dp4a kernels at N = 1 / 5 for reference;
#  - issue 5: the host kernels with a second, farther prefetch into L2 (prefetcht1), 12 copies.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
CFGS='[{"pipe":0},{"pipe":1,"rt":1,"nst":2},{"pipe":1,"rt":1,"nst":3},{"pipe":1,"rt":2,"nst":2},{"pipe":1,"rt":2,"nst":3}]'
exec bash bench/suite.sh 560 \
 "tests|170|python3 -m pytest -q -rf --tb=short tests/test_gemv_mma_device.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "sweep|210|python3 bench/gemv.py --impls mma --formats IQ4_XS,Q5_K,Q4_K,Q6_K --check-shapes '' --shapes ffn,head --ns 1,5,8 --configs '$CFGS' --budget 150 --out \$D > \$D/full.txt 2>&1; python3 bench/gemv.py --impls cu --formats IQ4_XS,Q5_K,Q4_K,Q6_K,Q8_0 --check-shapes '' --shapes ffn,head --ns 1,5 --budget 40 --out \$D/cu > \$D/cu.txt 2>&1; grep -E '^\\| (mma|cu)' \$D/full.txt \$D/cu.txt | cut -d'|' -f2-8,11- " \
 "host|110|python3 bench/cpu_gemv_avx512.py --rows 17408 --reps 2 --copies 12 --formats IQ4_XS,Q5_K,Q6_K --prefetch 2048,2048:8192,2048:16384,1024:8192,0:8192 > \$D/full.txt 2>&1; rc=\$?; cat \$D/full.txt | tail -6; exit \$rc"
