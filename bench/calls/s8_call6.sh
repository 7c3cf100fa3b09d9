#!/bin/bash
# Session 8, device call 6 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 11, the fixed cost
# of the CUDA tq3 attention (call 4: 10 us per layer at depth 0 with 4 warps): split-K CTAs past
# the last row now leave before any setup, and the first tiles' cp.async copies are issued before
# the q / codebook setup. Device tests of every changed kernel (write kernel with the selects,
# attention at 4 warps, the empty CTAs), then tq3 vs f16 e2e and the PDL-off profiles.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 400 \
 "tests|110|python3 -m pytest -q -rf --tb=short tests/test_rht.py tests/test_kvquant_kernel.py tests/test_attn_decode_q_cuda.py tests/test_attn_decode_q_extras.py tests/test_executor_kvquant.py tests/test_pdl_device.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "ab|130|for r in 1 2; do TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types f16,tq3 --out \$D/r\$r > \$D/r\$r.txt 2>&1; grep -E '^ +(f16|tq3) ' \$D/r\$r.txt; done" \
 "prof|70|for d in 0 32768; do for k in f16 tq3; do mkdir -p \$D/\$k\$d; TIGHTFIT_PDL=0 python3 bench/step_profile.py --kv-type \$k --depth \$d --steps 6 --out \$D/\$k\$d > \$D/\$k\$d.txt 2>&1; echo \"\$k depth \$d: \$(grep -E '^step' \$D/\$k\$d.txt | cut -c1-40) | \$(grep -E '^(attn_q_kernel|_attn_kernel|_merge_out|_qkv_write|_qk_prep|_reduce_kernel) ' \$D/\$k\$d.txt | tr -s ' ' | cut -d' ' -f1,4 | tr '\n' ' ')\"; done; done"
