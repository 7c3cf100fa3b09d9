#!/bin/bash
# (Historical record: TIGHTFIT_KVWRITE and the warp write kernel it measured were removed in 60cd58b: slower.)
# Next session, device call 1 (carry [".whl", ".tcache_in", ".fixtures"]; .tcache_in = session 7
# call 5's pruned cache). Compile-checked offline first: `PYTHONPATH=$PWD /tmp/tri36/bin/python
# scripts/compile_check.py -k kv_write -k kv_block` (and --pdl).
#  - issue 11: the warp-per-norm-block K/V write (TIGHTFIT_KVWRITE=warp, kv_write_q_warp) vs the
#    4-warp row kernel: device tests (same bytes as the torch path), tq3 decode at 0 / 32K with f16
#    as the control, and the PDL-off step profile (session 7: the write took 24.8 us per layer);
#  - issue 10: the forced-acceptance speculative bench now that greedy rounds copy argmaxes, not
#    rows; verify_profile with device embedding (session 7's 2.4 ms around the graph were host
#    embedding rows).
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 570 \
 "kvtests|90|TIGHTFIT_KVWRITE=warp python3 -m pytest -q -rf --tb=short tests/test_kvquant_kernel.py tests/test_executor_kvquant.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "ab|110|for m in row warp; do TIGHTFIT_KVWRITE=\$m TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types tq3 --out \$D/\$m 2>&1 | grep -E '^ +tq3'; done; TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types f16 --out \$D/f16 2>&1 | grep -E '^ +f16'" \
 "prof|50|TIGHTFIT_KVWRITE=warp TIGHTFIT_PDL=0 python3 bench/step_profile.py --kv-type tq3 --depth 32768 --out \$D 2>&1 | grep -v Warn | head -16" \
 "spec|200|TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec.py --seedmix --skip-real --forced-modes fixed --budget-s 180 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -25 \$D/full.txt; exit \$rc" \
 "verify|80|python3 bench/verify_profile.py --ms 1,5,8 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -6 \$D/full.txt; exit \$rc"
