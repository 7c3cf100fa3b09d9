#!/bin/bash
# Session 24, device call 5. Carry [".whl", ".tcache_in"].
# The review moved the half-scaled mma of IQ2_XS / IQ2_S from its own branch of tf_mma_block into
# tf_mma_group (one loop for every format without mins): their device tests again, and their time.
export TIGHTFIT_DEVICE_EMBED=1
T='python3 -m pytest -q tests/test_gemv_mma_device.py -k "IQ2_XS or IQ2_S" -p no:cacheprovider 2>&1 | tail -3'
G='python3 bench/gemv.py --impls mma --formats IQ2_S,IQ2_XS --check-shapes "" --shapes ffn --ns 5 --budget 40 --out $D 2>&1 | tail -8'
exec bash bench/suite.sh 200 "tests|110|$T" "gemv|70|$G"
