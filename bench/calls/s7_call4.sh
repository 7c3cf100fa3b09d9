#!/bin/bash
# (Historical record: the K/V write variants it measured were removed in 7b88e4c; TIGHTFIT_KVWRITE no longer exists.)
# Device call 4 (carry [".whl", ".tcache_in", ".fixtures"]; .tcache_in = call 3's cache):
#  - issue 11: call 3 measured the per-block K/V write SLOWER (tq3 depth 0: GPU 8.10 ms vs 7.86 in
#    session 6). A/B of the three program layouts (TIGHTFIT_KVWRITE=block|kvblock|row) on tq3
#    decode at 0 / 32K, f16 as the control; the write-kernel device tests; the step profile with
#    PDL off (per-kernel times without dependent-launch waits);
#  - issue 10: verify_profile (fixed: the step timing no longer leaves the device position ahead).
exec bash bench/suite.sh 480 \
 "ab|150|for m in block kvblock row; do TIGHTFIT_KVWRITE=\$m TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types tq3 --out \$D/\$m 2>&1 | grep -E '^ +tq3'; done; TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types f16 --out \$D/f16 2>&1 | grep -E '^ +f16'" \
 "kvtests|80|python3 -m pytest -q -rf --tb=short tests/test_kvquant_kernel.py -k 'write or 27b' > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "verify|120|python3 bench/verify_profile.py --ms 1,5,8 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -8 \$D/full.txt; exit \$rc" \
 "prof|80|for kv in tq3 f16; do TIGHTFIT_PDL=0 python3 bench/step_profile.py --kv-type \$kv --depth 32768 --out \$D 2>&1 | grep -v Warn | head -22; done"
