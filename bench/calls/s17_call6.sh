#!/bin/bash
# Session 17, device call 6. Carry [".whl", ".tcache_in", ".fixtures"].
# (the per-instruction CSVs come back in results.tgz)
# Where tf_mmh_iq4's warps stall, per SASS instruction (Nsight Compute source counters), IQ4_XS
# 5120->17408 at N = 5: rt 1 nb 1 (the fastest) and rt 1 nb 2 (register prefetch, slower).
exec bash bench/suite.sh 200 \
 "src|170|for nb in 1 2; do ncu --clock-control none --section SourceCounters --section WarpStateStats -k regex:tf_mmh -s 1 -c 1 -o \$D/nb\$nb python3 bench/ncu_gemv.py --impl mmh --types IQ4_XS --shape 5120,17408 --n 5 --config \"{\\\"rt\\\":1,\\\"nb\\\":\$nb}\" > \$D/nb\$nb.log 2>&1; ncu -i \$D/nb\$nb.ncu-rep --page source --csv --print-source sass > \$D/nb\$nb.csv 2>\$D/nb\$nb.err; rm -f \$D/nb\$nb.ncu-rep; ls -la \$D; head -c 300 \$D/nb\$nb.csv; done"
