#!/bin/bash
# Session 10, device call 3 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 10:
#  - tensor-core GEMV: the grid now fills every resident slot (fill, call 2's ncu: 227 of 264 CTAs)
#    and IQ4_XS decodes a whole code word at once (lut2): device tests, sweep fill 0 / 1 at N = 1/5/8;
#  - the verify block and the forced-acceptance bench with both.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
CFGS='[{"fill":0},{"fill":1},{"fill":1,"pipe":1}]'
exec bash bench/suite.sh 560 \
 "tests|120|python3 -m pytest -q -rf --tb=short tests/test_gemv_mma_device.py tests/test_verify_graph.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "sweep|120|python3 bench/gemv.py --impls mma --formats IQ4_XS,Q5_K,Q4_K,Q6_K --check-shapes '' --shapes ffn --ns 1,5,8 --configs '$CFGS' --budget 90 --out \$D > \$D/full.txt 2>&1; grep -E '^\\| mma' \$D/full.txt | cut -d'|' -f2-8,11-" \
 "verify|100|python3 bench/verify_profile.py --ms 5,8 --out \$D > \$D/v.txt 2>&1; tail -3 \$D/v.txt; grep -E 'tf_mma|gemv ' \$D/v.txt | head -12" \
 "spec|150|TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec.py --seedmix --skip-real --forced-modes fixed --budget-s 120 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -14 \$D/full.txt; exit \$rc"
