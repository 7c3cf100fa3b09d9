#!/bin/bash
# Session 10, device call 6 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 10: call 5 found the
# verify block's first row choosing another token than the step at the very first position, with
# and without the tensor-core GEMV. bench/spec_exact.py: per position, step logits vs block row 0.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 300 \
 "mma1|130|TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec_exact.py --positions 24 --out \$D > \$D/full.txt 2>&1; tail -28 \$D/full.txt" \
 "mma0|100|TIGHTFIT_GEMV_MMA=0 TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec_exact.py --positions 24 --out \$D > \$D/full.txt 2>&1; tail -28 \$D/full.txt"
