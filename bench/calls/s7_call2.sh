#!/bin/bash
# Device call 2 (carry [".whl", ".tcache_in", ".fixtures"]; .tcache_in = call 1b's pruned cache):
#  - issue 7: the golden comparison again (types outside issue 6's list and the tiny preset's
#    64-wide rows are now expected refusals), and the quantized-KV tests after the 66-byte-row fix;
#  - issue 6: the GEMV table at every shape of the issue, one run;
#  - issue 11: per-kernel step profiles with f16 and tq3 caches at 32K.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
F=Q8_0,Q4_0,Q5_0,IQ4_NL,IQ4_XS,Q4_K,Q5_K,Q6_K,Q2_K,Q3_K,IQ2_XXS,IQ2_XS,IQ2_S,IQ3_XXS,IQ3_S,TQ1_0,TQ2_0,Q1_0,Q2_0
exec bash bench/suite.sh 585 \
 "goldens|150|bash bench/calls/goldens_gpu.sh 4" \
 "kvtests|90|python3 -m pytest -q -rf --tb=short tests/test_attn_decode_q_extras.py tests/test_kvquant_kernel.py tests/test_attn_decode_q_cuda.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -30; exit \$rc" \
 "gemv|170|python3 bench/gemv.py --impls cu --formats $F --check-shapes kv --check-ns 1,8 --shapes ffn,attn,other,head --ns 1,8 --budget 150 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -100 \$D/full.txt; exit \$rc" \
 "prof|140|for kv in tq3 f16; do python3 bench/step_profile.py --kv-type \$kv --depth 32768 --out \$D 2>&1 | head -40; done"
