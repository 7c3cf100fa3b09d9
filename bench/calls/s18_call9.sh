#!/bin/bash
# Session 18, device call 9. Carry [".whl", ".tcache_in", ".fixtures"].
# (the CSVs come back in results.tgz)
# Where gemv_mmh "foldp" (tf_mmh2_iq4, packed x) waits: Nsight Compute sections and per-SASS
# source counters, IQ4_XS 5120->17408 at N = 5.
exec bash bench/suite.sh 240 \
 "ncu|200|ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --section InstructionStats --section SourceCounters -k regex:tf_mmh2 -s 1 -c 1 -o \$D/f python3 bench/ncu_gemv.py --impl mmh --types IQ4_XS --shape 5120,17408 --n 5 --config '{\"rt\":1,\"kind\":\"foldp\"}' > \$D/f.log 2>&1; ncu -i \$D/f.ncu-rep --page details --csv > \$D/details.csv 2>\$D/d.err; ncu -i \$D/f.ncu-rep --page source --csv --print-source sass > \$D/src.csv 2>\$D/s.err; rm -f \$D/f.ncu-rep; ls -la \$D; grep -E 'Duration|L1/TEX Cache Throughput|DRAM Throughput|Issued Warp|Stall|No Eligible|Active Warps' \$D/details.csv | cut -c1-200 | head -40"
