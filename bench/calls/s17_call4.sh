#!/bin/bash
# Session 17, device call 4. Carry [".whl", ".tcache_in", ".fixtures"].
# gemv_mmh at 3 resident CTAs per SM (80 registers, 24 warps per SM: call 3 measured 3.7 active warps per
# scheduler and a per-warp issue rate above the dp4a kernel's), against 2, with rt / nb variants.
exec bash bench/suite.sh 300 \
 "mmh|240|python3 bench/mmh.py --out \$D --shapes 5120x17408,17408x5120,5120x12288,6144x5120 --ns 1,5 --check-ns 5"
