#!/bin/bash
# Session 8, device call 4 (carry [".whl", ".tcache_in"]): issue 5, the 8 GiB placed decode
# (0.44-0.51 of the host roofline, bar 0.80). A/B of where the host rows live: the file mapping
# (default) vs anonymous huge-page memory (TIGHTFIT_HOST_ROWS=anon, arena.host_copy; one matrix
# measured 73-95 vs 89-105 GB/s in session 6), each with numba's pool and pool - 1 threads (the
# Python thread driving the GPU shares the cores). First the two device test modules that have
# not run on a GPU since session 6 moved them onto tests/_gpu_blocks.py.
exec bash bench/suite.sh 575 \
 "devtests|70|python3 -m pytest -q -rf --tb=short tests/test_gemv_mma_device.py tests/test_pdl_device.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head -20; exit \$rc" \
 "mmap|235|python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0,-1 --out \$D 2>&1 | tail -25" \
 "anon|235|TIGHTFIT_HOST_ROWS=anon python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0,-1 --out \$D 2>&1 | tail -25"
