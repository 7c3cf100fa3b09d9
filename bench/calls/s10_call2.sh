#!/bin/bash
# Session 10, device call 2 (carry [".whl", ".tcache_in", ".fixtures"]).
#  - issue 10: what limits the tensor-core GEMV (ncu: tf_mma_rt IQ4_XS / Q5_K at N = 5, the pipe
#    variant, and gemv_cuda's N = 1 kernel for comparison), then the verify block with Q6_K on the
#    pipelined kernel from N = 4 (the new default) against TIGHTFIT_MMA_PIPE=0.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
NCU="ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section InstructionStats --section MemoryWorkloadAnalysis --print-details all"
KEYS='Duration|Stall|Issued|Eligible|Warp Cycles|Achieved Occupancy|Registers Per|Grid Size|Memory Throughput|DRAM Throughput|Executed Ipc|No Eligible|Active Warps|Dynamic Shared|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth|Compute \(SM\)'
exec bash bench/suite.sh 560 \
 "ncu|200|$NCU -k regex:tf_mma -c 6 python3 bench/ncu_gemv.py --impl mma --types IQ4_XS,Q5_K --shape 5120,17408 --n 5 > \$D/mma.txt 2>&1; $NCU -k regex:tf_mma_pipe -c 2 python3 bench/ncu_gemv.py --impl mma --types IQ4_XS --shape 5120,17408 --n 5 --config '{\"pipe\":1}' > \$D/pipe.txt 2>&1; $NCU -k regex:tf_gemv -c 2 python3 bench/ncu_gemv.py --impl cu --types IQ4_XS --shape 5120,17408 --n 1 > \$D/cu.txt 2>&1; for f in mma pipe cu; do echo \"== \$f\"; grep -E \"$KEYS|tf_\" \$D/\$f.txt | grep -v '^==PROF' | cut -c1-150 | head -90; done" \
 "verify|200|for p in def 0; do mkdir -p \$D/p\$p; if [ \$p = def ]; then unset TIGHTFIT_MMA_PIPE; else export TIGHTFIT_MMA_PIPE=0; fi; python3 bench/verify_profile.py --ms 5,8 --out \$D/p\$p > \$D/p\$p.txt 2>&1; echo \"pipe \$p\"; tail -3 \$D/p\$p.txt; grep -iE 'gemv|mma' \$D/p\$p.txt | sort -k3 -n -r | head -8; done"
