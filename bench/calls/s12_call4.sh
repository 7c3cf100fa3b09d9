#!/bin/bash
# Session 12, device call 4. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 5: host rows read by the GPU over PCIe beside the CPU (tightfit.model.pcie_rows).
#  1. device tests: registered rows read in place, the segment graphs with the default share;
#  2. the 8 GiB decode per share (bench/pcie_decode.py), then a host profile of the best one.
export TIGHTFIT_DEVICE_EMBED=1
exec bash bench/suite.sh 570 \
 "tests|150|python3 -m pytest -q -x tests/test_pcie_rows.py 2>&1 | tail -2; python3 -m pytest -q -x tests/test_segments.py 2>&1 | tail -2" \
 "pcie|380|python3 bench/pcie_decode.py --shares 0,0.3,0.4,0.5,0.6 --tokens 24 --out \$D > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt | tail -30; exit \$rc"
