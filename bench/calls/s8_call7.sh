#!/bin/bash
# (Historical record: the early trigger it measured gained nothing (tq3/f16 0.966-0.970 at 32K, as before) and was reverted.)
# Session 8, device call 7 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 11: call 6 had tq3
# level with f16 at 32K with PDL off (8,466 vs 8,431 us) but 3 % behind with PDL on: the CUDA
# attention kernel triggered its dependents only after its main loop. It now triggers right
# after its wait, as the step's Triton kernels do. Device tests of the PDL chain, then e2e.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 200 \
 "tests|60|python3 -m pytest -q -rf --tb=short tests/test_attn_decode_q_cuda.py tests/test_pdl_device.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "ab|100|for r in 1 2; do TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types f16,tq3 --out \$D/r\$r > \$D/r\$r.txt 2>&1; grep -E '^ +(f16|tq3) ' \$D/r\$r.txt; done"
