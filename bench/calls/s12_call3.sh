#!/bin/bash
# Session 12, device call 3. Carry [".whl", ".tcache_in", ".fixtures"].
# Issue 5: can the GPU read host rows in place over PCIe (cudaHostRegister Mapped|ReadOnly on a
# page-cache file mapping) while the CPU computes other host rows, each at its solo rate?
exec bash bench/suite.sh 400 \
 "zerocopy|300|python3 bench/zero_copy.py --gb 2.8 --types IQ4_XS,Q5_K,Q6_K > \$D/full.txt 2>&1; rc=\$?; grep -v Warn \$D/full.txt | tail -12; exit \$rc"
