#!/bin/bash
# Session 17, device call 2. Carry [".whl", ".tcache_in", ".fixtures"].
# gemv_mmh with NB raw buffers in flight per warp (software pipelining) and RT row tiles: every
# (rt, nb) variant at N = 1 and 5 against gemv_cuda / gemv_mma, on the wide IQ4_XS shapes.
exec bash bench/suite.sh 300 \
 "mmh|240|python3 bench/mmh.py --out \$D --shapes 5120x17408,17408x5120,5120x12288,6144x5120 --ns 1,5,8 --check-ns 1,5"
