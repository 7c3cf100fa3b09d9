#!/bin/bash
# Session 11, device call 4. Carry [".whl", ".tcache_in", ".fixtures"].
# The fixup's arrivals moved to the end of each warp's range, with acq_rel atomics instead of
# fence.sc (call 3: the fence + arrival at every split group cost 14.76 vs 12.80 ms at M = 5):
#  1. the tensor-core GEMV device tests (bitwise repeatability, graph replay, counters);
#  2. prefill repeatability with TIGHTFIT_GEMV_MMA=1; 3. the verify block's cost; 4. the spec bench.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 540 \
 "tests|200|python3 -m pytest -q -x tests/test_gemv_mma_device.py tests/test_gemv_route_mma.py 2>&1 | tail -5" \
 "exact|70|TIGHTFIT_GEMV_MMA=1 python3 bench/spec_exact.py --positions 4 > \$D/full.txt 2>&1; rc=\$?; tail -8 \$D/full.txt; exit \$rc" \
 "verify|70|TIGHTFIT_GEMV_MMA=1 python3 bench/verify_profile.py --ms 5,8 --out \$D > \$D/v.txt 2>&1; tail -3 \$D/v.txt" \
 "spec|170|TIGHTFIT_GEMV_MMA=1 python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --max-tokens 512 --real-prompts repeat --budget-s 150 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -10 \$D/full.txt; exit \$rc"
