#!/bin/bash
# Session 9, device call 2 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 11, from call 1:
#  - ncu at 64 rows: 89 % of attn_q_kernel's shared wavefronts were a 32-way bank conflict in the
#    closing merge of the warps' accumulators; rows are now padded (TF_ACC_RS);
#  - the chain q-rotation -> attention -> merge at 32K: 46.1 us/layer with PDL off, 71.4 with it.
#    Launch shared memory now caps the CTAs per SM at ceil(grid / SMs) (TIGHTFIT_ATTNQ_SPREAD,
#    on by default; A/B here), and TIGHTFIT_PDL_OFF=attnq_cuda isolates the attention's own PDL.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
KQ="python3 bench/kv_quant.py --types f16,tq3 --pdl 0,1 --pieces"
NCU="ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section Occupancy --section SourceCounters"
exec bash bench/suite.sh 560 \
 "tests|110|python3 -m pytest -q -rf --tb=short tests/test_kvquant_kernel.py tests/test_attn_decode_q_cuda.py tests/test_attn_decode_q_extras.py tests/test_executor_kvquant.py tests/test_pdl_device.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "pieces|150|for v in spread1 spread0 attnoff; do case \$v in spread0) export TIGHTFIT_ATTNQ_SPREAD=0;; attnoff) export TIGHTFIT_ATTNQ_SPREAD=1 TIGHTFIT_PDL_OFF=attnq_cuda;; esac; echo \"== \$v\"; for c in 32768 64; do $KQ --ctx \$c --out \$D/\$v\$c > \$D/\$v\$c.txt 2>&1; grep -E '^ +(f16|tq3) ' \$D/\$v\$c.txt; done; done" \
 "ncu0|100|$NCU -k regex:attn_q_kernel -c 2 python3 bench/kv_quant.py --ctx 64 --types tq3 --out \$D > \$D/ncu_tq3_64.txt 2>&1; grep -E 'Duration|Eligible|Warp Cycles|Achieved|excessive' \$D/ncu_tq3_64.txt | head -12" \
 "ab|130|TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types f16,tq3 --out \$D/r1 > \$D/r1.txt 2>&1; grep -E '^ +(f16|tq3) ' \$D/r1.txt"
