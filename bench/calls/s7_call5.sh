#!/bin/bash
# (Historical record: the K/V write variants it measured were removed in 7b88e4c; TIGHTFIT_KVWRITE no longer exists.)
# Device call 5 (carry [".whl", ".tcache_in", ".fixtures"]; .tcache_in = call 4's cache): the K/V
# write kernel with codebook levels selected from registers (call 4, PDL off: 24.8 us per layer for
# every program layout -> dependent round trips, not work) and distinct names for the K and V
# rows (call 4: tq4_128+tq2 did not compile on the GPU); tests, tq3 vs f16 decode, tq3 profile.
exec bash bench/suite.sh 230 \
 "kvtests|70|python3 -m pytest -q -rf --tb=short tests/test_kvquant_kernel.py -k 'write or 27b' > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "ab|100|for m in block row; do TIGHTFIT_KVWRITE=\$m TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types tq3 --out \$D/\$m 2>&1 | grep -E '^ +tq3'; done; TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 48 --depths 0,32768 --ctx 33408 --kv-types f16 --out \$D/f16 2>&1 | grep -E '^ +f16'" \
 "prof|45|TIGHTFIT_PDL=0 python3 bench/step_profile.py --kv-type tq3 --depth 32768 --out \$D 2>&1 | grep -v Warn | head -16"
