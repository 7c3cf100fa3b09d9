#!/bin/bash
# Session 9, device call 4 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 5: call 1 measured
# the AVX-512 host kernels at ~5 GB/s per thread streaming vs ~12 cache-resident on this host.
# Software prefetch (cpu_gemv_avx512.PREFETCH, TIGHTFIT_CPU_PREFETCH bytes ahead): sweep the
# distance per core and on 16 threads, then the 8 GiB placed decode without and with the best one.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 560 \
 "sweep|120|python3 bench/cpu_gemv_avx512.py --rows 17408 --reps 5 --prefetch 0,256,512,1024,2048,4096 > \$D/sweep.txt 2>&1; rc=\$?; cat \$D/sweep.txt; python3 -c \"
import sys
rows=[l.split() for l in open('\$D/sweep.txt') if l.split() and l.split()[0] in ('IQ4_XS','Q4_K','Q5_K','Q6_K')]
hdr=[l.split() for l in open('\$D/sweep.txt') if l.startswith('format')][0]
pfs=[0,256,512,1024,2048,4096]; n=len(pfs)
# columns: format MB | 1t AVX2, 1t pf.. | Nt AVX2, Nt pf..
mt=[sum(float(r[2+n+2+i]) for r in rows)/len(rows) for i in range(n)]
best=pfs[max(range(n), key=lambda i: mt[i])]
open('/tmp/best_pf','w').write(str(best)); print('mean 16t GB/s per distance', dict(zip(pfs,[round(v,1) for v in mt])), 'best', best)
\"; exit \$rc" \
 "pf0|170|TIGHTFIT_CPU_PREFETCH=0 python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -14 \$D/full.txt; exit \$rc" \
 "pfbest|170|export TIGHTFIT_CPU_PREFETCH=\$(cat /tmp/best_pf 2>/dev/null || echo 1024); echo prefetch \$TIGHTFIT_CPU_PREFETCH; python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -14 \$D/full.txt; exit \$rc"
