#!/bin/bash
# Session 24, device call 1. Carry [".whl", ".tcache_in"].
# The grid formats (IQ2_XS, IQ3_XXS, IQ3_S, IQ2_S) on the int8 tensor-core GEMV (gemv_mma_iq.cuh):
# their device tests against gguf-py's dequantization and gemv_cuda; their times per kernel config
# against gemv_cuda; the verify block M = 5 with them on the dp4a kernels (TIGHTFIT_MMA_GRID=0) and
# on tf_mma_rt (the routing default of this commit).
export TIGHTFIT_DEVICE_EMBED=1
T='python3 -m pytest -q -x tests/test_gemv_mma_device.py -k "IQ2_XS or IQ3_XXS or IQ3_S or IQ2_S" -p no:cacheprovider 2>&1 | tail -5'
G='python3 bench/gemv.py --impls cu --formats IQ2_S,IQ3_XXS,IQ2_XS,IQ3_S --check-shapes "" --shapes ffn --ns 1,5,8 --budget 60 --out $D/cu 2>&1 | tail -30; python3 bench/gemv.py --impls mma --formats IQ2_S,IQ3_XXS,IQ2_XS,IQ3_S --check-shapes "" --shapes ffn --ns 1,5,8 --configs "[{\"rt\": 1}, {\"rt\": 2}, {\"pipe\": 1, \"rt\": 1}, {\"pipe\": 1, \"rt\": 2}]" --budget 110 --out $D/mma 2>&1 | tail -60'
V0='TIGHTFIT_MMA_GRID=0 python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|^ *[15] " $D/v.txt | head -6; exit $rc'
V1='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|^ *[15] " $D/v.txt | head -6; exit $rc'
exec bash bench/suite.sh 585 "tests|120|$T" "gemv|190|$G" "v_off|170|$V0" "v_rt|90|$V1"
