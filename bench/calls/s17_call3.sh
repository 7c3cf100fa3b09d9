#!/bin/bash
# Session 17, device call 3. Carry [".whl", ".tcache_in", ".fixtures"].
# Why is gemv_mmh (41.6 instructions per 512 weights) no faster than gemv_mma (65.6) and 1.5x the
# dp4a N = 1 kernel (57.5)? Nsight Compute on IQ4_XS 5120->17408: mmh N = 1 and 5 (rt 1, nb 1),
# cu N = 1: DRAM throughput, L1/L2 sectors per request and hit rates, stalls, issue rate.
NCU="ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section InstructionStats --print-details all"
KEYS='Duration|Stall|Issued|Eligible|Warp Cycles|Achieved Occupancy|DRAM Throughput|Executed Ipc|No Eligible|Active Warps|Hit Rate|Mem Busy|Max Bandwidth|Sectors|Requests|Wavefront|Executed Instructions|Bank|dram__|Memory Throughput|L2 Compression|Excessive'
exec bash bench/suite.sh 200 \
 "ncu|170|for c in 'mmh 1 {\"rt\":1,\"nb\":1}' 'mmh 5 {\"rt\":1,\"nb\":1}' 'cu 1 {}'; do set -- \$c; echo \"=== \$1 N=\$2 \$3\"; $NCU -k regex:'tf_' -s 1 -c 1 python3 bench/ncu_gemv.py --impl \$1 --types IQ4_XS --shape 5120,17408 --n \$2 --config \"\$3\" > \$D/\$1_\$2.txt 2>&1; grep -E \"$KEYS\" \$D/\$1_\$2.txt | grep -v '^==PROF' | sed 's/  */ /g' | cut -c1-120 | head -70; done"
