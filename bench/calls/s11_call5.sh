#!/bin/bash
# Session 11, device call 5. Carry [".whl", ".tcache_in", ".fixtures"].
# The deterministic fixup, two arrival schemes (TIGHTFIT_MMA_FIXUP=end: at the end of each warp's
# range, one fence and both atomics in flight; =mid: at each split group as it completes; both
# with fence.acq_rel + relaxed atomics instead of fence.sc), reduce loads one piece at a time:
#  1. the tensor-core GEMV device tests (default scheme); 2. the verify block per scheme;
#  3. the speculative bench (forced acceptance) per scheme.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
export TIGHTFIT_GEMV_MMA=1
exec bash bench/suite.sh 560 \
 "tests|150|python3 -m pytest -q -x tests/test_gemv_mma_device.py 2>&1 | tail -3; TIGHTFIT_MMA_FIXUP=mid python3 -m pytest -q -x tests/test_gemv_mma_device.py -k 'bitwise or graph or counters' 2>&1 | tail -2" \
 "verify|120|python3 -c 'import sys, argparse; sys.path.insert(0, \"bench\"); from spec import build_model; build_model(argparse.Namespace(model=None, seedmix=True, path=None, mtp=False, layers=None))'; for f in end mid; do TIGHTFIT_MMA_FIXUP=\$f python3 bench/verify_profile.py --ms 5,8 --out \$D/\$f > \$D/\$f.txt 2>&1; echo \"fixup \$f\"; tail -3 \$D/\$f.txt; done" \
 "spec|220|for f in end mid; do TIGHTFIT_MMA_FIXUP=\$f python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --force-accept 0,0.8 --max-tokens 512 --skip-real --budget-s 100 --out \$D/\$f > \$D/\$f.txt 2>&1; echo \"fixup \$f\"; tail -8 \$D/\$f.txt; done"
