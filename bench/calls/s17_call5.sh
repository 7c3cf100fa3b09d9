#!/bin/bash
# Session 17, device call 5. Carry [".whl", ".tcache_in", ".fixtures"].
# gemv_mmh through a per-warp cp.async ring (pipe 2 | 3 stages, one CTA per SM, 272 contiguous bytes
# per row per copy) against the register-loading kernel: does it wait on how it reads DRAM?
exec bash bench/suite.sh 300 \
 "mmh|240|python3 bench/mmh.py --out \$D --shapes 5120x17408,17408x5120,5120x12288,6144x5120 --ns 1,5 --check-ns 1,5"
