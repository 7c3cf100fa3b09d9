#!/bin/bash
# Session 17, device call 1. Carry [".whl", ".tcache_in", ".fixtures"].
# The bf16 byte-table GEMV (gemv_mmh, IQ4_XS): correctness against the GGUF reference, then
# timing against gemv_cuda (dp4a) and gemv_mma (int8 tensor cores) on the 27B's IQ4_XS shapes.
exec bash bench/suite.sh 300 \
 "mmh|240|python3 bench/mmh.py --out \$D"
