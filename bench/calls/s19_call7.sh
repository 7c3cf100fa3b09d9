#!/bin/bash
# Session 19, device call 7 (call 6 failed to compile under NVRTC: uintptr_t). Carry [".whl", ".tcache_in", ".fixtures"].
# The verify block M = 5 with tf_mma_rt's L2 bulk prefetch 2 and 4 steps ahead (call 6: 0 = 12.77 ms).
export TIGHTFIT_DEVICE_EMBED=1
V5='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "graph|M_Q5_K|M_Q4_K" $D/v.txt | head -5; exit $rc'
exec bash bench/suite.sh 170 \
 "pf2|60|TIGHTFIT_MMA_PF=2 $V5" \
 "pf4|60|TIGHTFIT_MMA_PF=4 $V5"
