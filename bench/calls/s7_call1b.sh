#!/bin/bash
# Device call 1b (carry [".whl", ".tcache_in", ".fixtures"]): call 1 lost the golden and KV-test
# results to its output filters (the golden run hit its limit before printing; the KV tests' summary
# was pushed out of `tail` by cupy's exit-time noise). Full logs now go to $D.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 560 \
 "goldens|330|bash bench/calls/goldens_gpu.sh 4" \
 "kvtests|150|python3 -m pytest -q -rf --tb=short tests/test_attn_decode_q_extras.py tests/test_kvquant_kernel.py tests/test_attn_decode_q_cuda.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -40; exit \$rc"
