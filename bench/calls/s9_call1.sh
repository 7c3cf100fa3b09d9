#!/bin/bash
# Next session, device call 1 (carry [".whl", ".tcache_in", ".fixtures"]; .tcache_in = session 8
# call 7's pruned cache). Diagnoses only (bench/NOTES.md, session 8):
#  - issue 11: the tq3 attention chain (write, attention, merge) vs f16's, alone, with PDL off and on,
#    per piece (where does tq3 lose ~13 us of PDL overlap per layer at 32K?);
#  - issue 11: Nsight Compute on the CUDA tq3 attention with a handful of cached rows (13.8 us per
#    layer for one row vs f16's 4.3): warp states and source counters;
#  - FIRST (landed without a device run in session 8): the finiteness commit as a multi-program scan
#    (norm._commit_kernel; was one program, 59 us per step / 290 us per 5-token verify block):
#    the kernel tests on the GPU, the step profile (its time) and a greedy e2e check;
#  - issue 5: the host kernels per core on this host (session 7's 15-28 GB/s per core were measured
#    on the CI machine's EPYC, not here), cache-resident and streaming, 1 and 16 threads.
NCU="ncu --clock-control none --section SpeedOfLight --section WarpStateStats --section SchedulerStats --section Occupancy --section LaunchStats --section SourceCounters"
exec bash bench/suite.sh 560 \
 "commit|90|python3 -m pytest -q -rf --tb=short tests/test_kernels_step.py tests/test_verify_graph.py tests/test_executor_cpu.py tests/test_executor_kvquant.py > \$D/full.txt 2>&1; rc=\$?; grep -E '^FAILED|^E  |passed|failed' \$D/full.txt | head; TIGHTFIT_PDL=0 python3 bench/step_profile.py --depth 0 --steps 6 --out \$D > \$D/prof.txt 2>&1; grep -E '^step|_commit_kernel' \$D/prof.txt; exit \$rc" \
 "pieces|150|python3 bench/kv_quant.py --ctx 32768 --types f16,tq3 --pdl 0,1 --pieces --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -30 \$D/full.txt; exit \$rc" \
 "ncu0|120|$NCU -k regex:attn_q_kernel -c 2 python3 bench/kv_quant.py --ctx 64 --types tq3 --out \$D > \$D/ncu_tq3_64.txt 2>&1; grep -E 'Duration|Stall|Issued|Eligible|Warp Cycles|Occupancy|Registers|Block Size|Grid Size|Shared|Local' \$D/ncu_tq3_64.txt | head -40" \
 "hostcore|150|python3 bench/cpu_gemv_avx512.py --rows 2048 --threads 1 --reps 5 2>&1 | tail -6; python3 bench/cpu_gemv_avx512.py --rows 17408 --threads 1 --reps 5 2>&1 | tail -6; python3 bench/cpu_gemv_avx512.py --rows 17408 --reps 5 2>&1 | tail -6"
