#!/bin/bash
# Session 10, device call 10 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 10: the CUDA GEMV
# at N = 5 passes on fresh random weights (call 9) but not on the 27B's loaded tensors (call 8):
# the same product on a copy of the weights, with and without the device embedding.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 200 \
 "emb1|80|TIGHTFIT_DEVICE_EMBED=1 python3 bench/model_gemv_check.py --n 5 --layers 0 --variants > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'cuda N|weights at' | head -30" \
 "emb0|80|TIGHTFIT_DEVICE_EMBED=0 python3 bench/model_gemv_check.py --n 5 --layers 0 > \$D/full.txt 2>&1; grep -v Warn \$D/full.txt | grep -E 'cuda N' | head -12"
