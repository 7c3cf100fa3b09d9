#!/bin/bash
# Session 9, device call 3 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 11 after call 2's
# two fixes (padded merge rows, CTAs per SM capped under PDL): decode per KV type at 0 / 8K / 32K /
# 128K in one process per type, then a second f16 / tq3 sample at 0 / 32K in the other order.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 560 \
 "e2e4|330|TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 64 --depths 0,8192,32768,131072 --ctx 131584 --kv-types f16,q8_0,tq3,tq4 --out \$D/r1 > \$D/r1.txt 2>&1; rc=\$?; grep -E '^ +(f16|q8_0|tq3|tq4) |peak' \$D/r1.txt; exit \$rc" \
 "ab|100|TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types tq3,f16 --out \$D/r2 > \$D/r2.txt 2>&1; grep -E '^ +(f16|tq3) ' \$D/r2.txt" \
 "prof|90|for k in f16 tq3; do mkdir -p \$D/\$k; TIGHTFIT_PDL=0 python3 bench/step_profile.py --kv-type \$k --depth 32768 --steps 6 --out \$D/\$k > \$D/\$k.txt 2>&1; echo \"\$k: \$(grep -E '^step' \$D/\$k.txt | cut -c1-40) | \$(grep -E '^(attn_q_kernel|_attn_kernel|_merge_out|_qkv_write|_qk_prep|_reduce_kernel) ' \$D/\$k.txt | tr -s ' ' | cut -d' ' -f1,4 | tr '\n' ' ')\"; done"
