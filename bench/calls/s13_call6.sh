#!/bin/bash
# Session 13, device call 6. Carry [".whl", ".tcache_in", ".fixtures"].
# The session's changed paths under CUDA: the verify graph and speculative loop (graph captures
# counted by model.onetime, drafts capped at the skinny-GEMV block), the copycat model.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 300 \
 "tests|260|python3 -m pytest -q -x tests/test_verify_graph.py tests/test_spec_block.py tests/test_spec_verify.py tests/test_spec_decode.py tests/test_copycat.py tests/test_executor_device_embed.py 2>&1 | grep -E '^E |passed|failed' | tail -6"
