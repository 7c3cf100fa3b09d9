#!/bin/bash
# Session 14, device call 6. Carry [".whl", ".tcache_in", ".fixtures"].
# Ran on 281a8a4 (TIGHTFIT_MMA_RED_BATCH; removed in 7aaf0c3).
# Issue 10: the fixup's reducing warp now issues the slot loads of TF_MMA_RED_BATCH pieces before
# adding them (one L2 round trip per batch instead of one per piece; the sum is the launch's tail,
# ~4-5 pieces per tile group on the FFN shapes). Same bits. M = 5 verify block at batch 1 (as
# before), 2 and 4 (the default), same machine.
export TIGHTFIT_DEVICE_EMBED=1
V='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|tf_m" $D/v.txt | head -7; exit $rc'
exec bash bench/suite.sh 400 \
 "b1|110|TIGHTFIT_MMA_RED_BATCH=1 $V" \
 "b4|110|$V" \
 "b2|110|TIGHTFIT_MMA_RED_BATCH=2 $V"
