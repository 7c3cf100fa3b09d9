#!/bin/bash
# Session 9, device call 8 (carry [".whl", ".tcache_in", ".fixtures"]). The tensor-core GEMV is now
# the default for 3-16 columns (call 7: verify block 13.79 vs 15.92 ms at M = 5, 1.52x vs 1.29x at
# forced 80 %): the GPU tests of every path that runs such products (verify graph, batched blocks,
# speculative decoding, the kernel itself).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 215 \
 "tests|200|python3 -m pytest -q -rf --tb=short tests/test_gemv_mma_device.py tests/test_gemv_route_mma.py tests/test_verify_graph.py tests/test_batch_forward.py tests/test_spec_block.py tests/test_spec_verify.py tests/test_spec_decode.py tests/test_executor_device_embed.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc"
