#!/bin/bash
# Session 14, device call 1 (written in session 13, not run: its device time was spent).
# Carry [".whl", ".tcache_in", ".fixtures"] (.tcache_in from the newest /work/.device/N).
# Issue 10, the verify block's GEMVs are latency-bound (session 13: ALU pipe ~40 % busy, 4 warps
# per scheduler). Occupancy A/B: launch bounds for 3 CTAs per SM (80 registers; offline every
# default kernel spills 80-900 bytes) against the default 2, same machine:
#  1. the GEMV device tests at 3 (bitwise repeatability, against the reference);
#  2. the M = 5 verify block at 2 then 3 (cold NVRTC compile of the MINB=3 modules: ~90 s).
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 560 \
 "tests3|200|TIGHTFIT_MMA_MINB=3 python3 -m pytest -q -x tests/test_gemv_mma_device.py 2>&1 | grep -E '^E |passed|failed' | tail -6" \
 "v2|120|python3 bench/verify_profile.py --ms 5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -E 'step:|graph|tf_mma' \$D/v.txt | head -8; exit \$rc" \
 "v3|120|TIGHTFIT_MMA_MINB=3 python3 bench/verify_profile.py --ms 5 --out \$D > \$D/v.txt 2>&1; rc=\$?; grep -E 'step:|graph|tf_mma' \$D/v.txt | head -8; exit \$rc"
