#!/bin/bash
# Session 10, device call 8 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 10 diagnosis: the
# 27B's own weight tensors through gemv_cuda (N columns, and one column at a time) and gemv_mma,
# against gguf-py's dequantization of sampled rows (bench/model_gemv_check.py).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 200 \
 "check|170|python3 bench/model_gemv_check.py --n 5 --layers 0,3 > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt | tail -60; exit \$rc"
