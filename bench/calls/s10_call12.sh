#!/bin/bash
# Session 10, device call 12 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 10: after the fp16
# fix, the CUDA GEMV at N = 5 on the 27B's tensors, and the tensor-core GEMV run twice (two
# prefills of one prompt still differ by 12 % with it, call 11).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 75 \
 "check|50|python3 bench/model_gemv_check.py --n 5 --layers 0 > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'cuda N|mma' | head -24"
