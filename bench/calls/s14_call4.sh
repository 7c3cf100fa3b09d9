#!/bin/bash
# Session 14, device call 4. Carry [".whl", ".tcache_in", ".fixtures"].
# Ran on 13c9ec9 (removed in b153df0).
# Issue 10: why is the tensor-core GEMV as slow at N = 1 as at N = 5 (IQ4_XS 5120->17408: 32.5 /
# 34.4 us) and 1.7x the dp4a N = 1 kernel (18.9 us), and why did the bulk-staged variant (more bytes
# in flight, no register loads) and more warps make it slower? Nsight Compute: stall reasons, IPC,
# pipes, L1 wavefronts of tf_mma_rt (N = 5, N = 1), tf_mmb (N = 5) and tf_gemv (N = 1).
NCU="ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --print-details all"
KEYS='Duration|Stall|Issued|Eligible|Warp Cycles|Achieved Occupancy|Registers Per|Grid Size|Block Size|DRAM Throughput|Executed Ipc|No Eligible|Active Warps|L1/TEX Hit|Mem Busy|Max Bandwidth|Compute \(SM\)|Pipe|Wavefront|Executed Instructions|ALU|FMA|Tensor|Shared'
exec bash bench/suite.sh 400 \
 "ncu|330|for c in 'mma 5 {\"bulk\":0}' 'mma 1 {\"bulk\":0}' 'mma 5 {\"bulk\":1}' 'cu 1 {}'; do set -- \$c; echo \"=== \$1 N=\$2 \$3\"; $NCU -k regex:'tf_' -s 1 -c 1 python3 bench/ncu_gemv.py --impl \$1 --types IQ4_XS --shape 5120,17408 --n \$2 --config \"\$3\" > \$D/\$1_\$2_\$3.txt 2>&1; grep -E \"$KEYS\" \$D/\$1_\$2_\$3.txt | grep -v '^==PROF' | sed 's/  */ /g' | cut -c1-110 | head -60; done"
