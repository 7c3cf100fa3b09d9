#!/bin/bash
# Session 14, device call 8. Carry [".whl", ".tcache_in", ".fixtures"].
# (the .ncu-rep reports and per-instruction CSVs come back in results.tgz)
# Issue 10: where tf_mma_rt's warps stall, per SASS instruction (Nsight Compute source counters),
# IQ4_XS and Q5_K 5120->17408 at N = 5, on the default kernels (commit b980b55).
exec bash bench/suite.sh 300 \
 "src|240|for t in IQ4_XS Q5_K; do ncu --clock-control none --section SourceCounters --section WarpStateStats -k regex:tf_mma_rt -s 1 -c 1 -o \$D/\$t python3 bench/ncu_gemv.py --impl mma --types \$t --shape 5120,17408 --n 5 > \$D/\$t.log 2>&1; ncu -i \$D/\$t.ncu-rep --page source --csv --print-source sass > \$D/\$t.csv 2>\$D/\$t.err; ls -la \$D; head -c 600 \$D/\$t.csv; done"
