#!/bin/bash
# (Historical record: the K/V write variants it measured were removed in 7b88e4c; TIGHTFIT_KVWRITE no longer exists.)
# Device call 3 (carry [".whl", ".tcache_in", ".fixtures"]; .tcache_in = call 2's cache):
#  - issue 11: the K/V write kernel split by (row, norm block) — device tests, then decode per KV
#    type at 0 / 8K / 32K / 128K (f16 and tq3; issue 7's figures at this commit too), and the tq3
#    step profile with PDL off (per-kernel times without the dependent-launch waits);
#  - issue 10: where a verify round's time goes (verify_profile), with and without gemv_mma.
exec bash bench/suite.sh 545 \
 "kvtests|80|python3 -m pytest -q -rf --tb=short tests/test_kvquant_kernel.py tests/test_attn_decode_q_cuda.py tests/test_pdl_device.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -30; exit \$rc" \
 "e2e|190|TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 64 --depths 0,8192,32768,131072 --ctx 131584 --kv-types f16,tq3 --out \$D" \
 "prof|40|for kv in tq3 f16; do TIGHTFIT_PDL=0 python3 bench/step_profile.py --kv-type \$kv --depth 32768 --out \$D 2>&1 | grep -v Warn | head -24; done" \
 "verify|140|python3 bench/verify_profile.py --ms 1,5,8 --out \$D > \$D/full.txt 2>&1; tail -20 \$D/full.txt; mkdir -p \$D/mma; TIGHTFIT_GEMV_MMA=1 python3 bench/verify_profile.py --ms 5,8 --out \$D/mma 2>&1 | tail -6"
