#!/bin/bash
# Session 12, device call 5. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 5: the 8 GiB decode per PCIe share around call 4's best (0.4), 32 tokens each, with the
# host read bandwidth measured four ways (numba / torch, before / after the load; the roofline
# takes the best), then a host profile of the best share.
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 400 \
 "pcie|340|python3 bench/pcie_decode.py --shares 0,0.35,0.4,0.45 --tokens 32 --out \$D > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt | tail -34; exit \$rc"
