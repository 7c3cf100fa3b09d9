#!/bin/bash
# Session 10, device call 11 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 10: the 27B's
# IQ4_XS / Q5_K / Q6_K block scales are fp16 subnormals, which tf_gemv3's CSE-friendly tf_h2f read
# as 0 under flush-to-zero (N >= 2 products on wide matrices: zero / wrong, calls 8-10). Fixed
# conversion: device tests with subnormal scales, step vs verify block (MMA on / off), then the
# speculative bench with the real drafters (the copy task twice: an agent replay on rep 1).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 320 \
 "tests|60|python3 -m pytest -q -rf --tb=line tests/test_gemv_cuda_device.py tests/test_gemv_mma_device.py -k 'subnormal or every_nc' > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|passed|failed' \$D/full.txt | cut -c1-160 | head -20; exit \$rc" \
 "exact|80|for g in 1 0; do TIGHTFIT_GEMV_MMA=\$g python3 bench/spec_exact.py --positions 8 > \$D/m\$g.txt 2>&1; echo \"mma \$g\"; tail -10 \$D/m\$g.txt; done" \
 "spec|130|python3 bench/spec.py --seedmix --forced-modes fixed --force-accept 0,0.8 --max-tokens 256 --real-prompts repeat --budget-s 110 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -9 \$D/full.txt; exit \$rc"
