#!/bin/bash
# Session 24, device call 6. Carry [".whl", ".tcache_in"].
# Q5_K's tensor-core kernel at one row tile with 3 or 4 blocks per step (TIGHTFIT_MMA_Q5K_U; 2 is the
# format's U since session 20): more contiguous bytes per row in flight, at the cost of spills
# (nvcc sm_90: 160 / 224 bytes at 3, 304 / 508 at 4; 8 / 12 at 2).
export TIGHTFIT_DEVICE_EMBED=1
G='for u in 0 3 4; do echo "U=$u"; TIGHTFIT_MMA_Q5K_U=$u python3 bench/gemv.py --impls mma --formats Q5_K --check-shapes "" --shapes ffn,attn --ns 5 --configs "[{\"rt\": 1}]" --budget 40 --out $D/u$u 2>&1 | grep "^| mma"; done'
exec bash bench/suite.sh 200 "q5u|170|$G"
