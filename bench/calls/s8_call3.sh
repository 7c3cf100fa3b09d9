#!/bin/bash
# Session 8, device call 3 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 11: call 2 put tq3
# at 0.96x f16 at depth 0 and 0.97x at 32K: a fixed ~15 us per attention layer that does not
# grow with depth. Per-kernel step profiles at depth 0 (PDL off: valid per kernel; PDL on: the
# step time) for f16, tq3 and tq3 with the Triton attention kernel instead of the CUDA one; the
# rotation now exact fp32 (selects; call 2's build had been compiled to a TF32 dot) re-timed
# e2e; the device tests again (rht at D = 256, gemv_mma's graph test with its atomic tolerance).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
P="python3 bench/step_profile.py --depth 0"
F="grep -v Warn \$D/full.txt | grep -E '^step|^[a-z/-]+ +[0-9]+ ' | head -8; grep -v Warn \$D/full.txt | grep -E 'attn|merge|qkv|qk_prep|_reduce_kernel|_quant_kernel|commit|embed|argmax' | head -12"
exec bash bench/suite.sh 560 \
 "tests|100|python3 -m pytest -q -rf --tb=short tests/test_rht.py tests/test_kvquant_kernel.py tests/test_gemv_mma_device.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "f16off|45|mkdir -p \$D/o; TIGHTFIT_PDL=0 $P --kv-type f16 --out \$D/o > \$D/full.txt 2>&1; $F" \
 "tq3off|45|mkdir -p \$D/o; TIGHTFIT_PDL=0 $P --kv-type tq3 --out \$D/o > \$D/full.txt 2>&1; $F" \
 "tq3trit|45|mkdir -p \$D/o; TIGHTFIT_ATTNQ=triton TIGHTFIT_PDL=0 $P --kv-type tq3 --out \$D/o > \$D/full.txt 2>&1; $F" \
 "pdlon|70|for k in f16 tq3; do mkdir -p \$D/\$k; $P --kv-type \$k --out \$D/\$k > \$D/\$k.txt 2>&1; grep -E '^step' \$D/\$k.txt; done" \
 "ab|130|for r in 1 2; do TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types f16,tq3 --out \$D/r\$r > \$D/r\$r.txt 2>&1; grep -E '^ +(f16|tq3) ' \$D/r\$r.txt; done"
