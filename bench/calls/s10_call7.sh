#!/bin/bash
# Session 10, device call 7 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 10: call 6 found the
# verify block's rows far from the step's on the 27B (rel. L2 0.42 with the tensor-core GEMV, row 0
# all zeros without it) and two prefills of one prompt 11 % apart with it. Bisect: one process per
# switch setting, bench/spec_exact.py at 3 positions.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
export TIGHTFIT_DEVICE_EMBED=1
run() { echo "== $1"; env $1 python3 bench/spec_exact.py --positions 3 > $D/$2.txt 2>&1; tail -6 $D/$2.txt | head -5; }
exec bash bench/suite.sh 420 \
 "bisect|380|$(declare -f run); run 'TIGHTFIT_GEMV_MMA=1' a; run 'TIGHTFIT_GEMV_MMA=0 TIGHTFIT_DEVICE_EMBED=0' j; run 'TIGHTFIT_MMA_FILL=0' b; run 'TIGHTFIT_MMA_PIPE=0' c; run 'TIGHTFIT_MMA_FILL=0 TIGHTFIT_MMA_PIPE=0' d; run 'TIGHTFIT_GEMV_MMA=0 TIGHTFIT_VERIFY_GRAPH=0' e; run 'TIGHTFIT_GEMV_MMA=0 TIGHTFIT_FUSE_QUANT=0' f; run 'TIGHTFIT_GEMV_MMA=0 TIGHTFIT_PDL=0' g; run 'TIGHTFIT_GEMV_MMA=0 TIGHTFIT_MERGE_LINEARS=0' h; run 'TIGHTFIT_PDL=0 TIGHTFIT_MERGE_LINEARS=0 TIGHTFIT_FUSE_QUANT=0' i"
