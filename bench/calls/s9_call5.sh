#!/bin/bash
# Session 9, device call 5 (carry [".whl", ".tcache_in", ".fixtures"]). Issue 5: call 4's sweep
# called one 47-73 MB matrix over and over and reached 95 GB/s on 16 threads, above the host read
# bandwidth plan_vram measures (86 GB/s): the last-level cache held part of it. Again with 12
# copies called in turn (0.6-0.9 GB), prefetch distances 0-4096; then the 8 GiB placed decode with
# the best distance if it beats none by 3 %.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 420 \
 "sweep|150|python3 bench/cpu_gemv_avx512.py --rows 17408 --reps 2 --copies 12 --prefetch 0,1024,2048,4096 > \$D/sweep.txt 2>&1; rc=\$?; cat \$D/sweep.txt; python3 -c \"
rows=[l.split() for l in open('\$D/sweep.txt') if l.split() and l.split()[0] in ('IQ4_XS','Q4_K','Q5_K','Q6_K')]
pfs=[0,1024,2048,4096]; n=len(pfs)
mt=[sum(float(r[4+n+i]) for r in rows)/len(rows) for i in range(n)]
b=max(range(n), key=lambda i: mt[i]); best=pfs[b] if mt[b] > 1.03*mt[0] else 0
open('/tmp/best_pf','w').write(str(best)); print('mean 16t GB/s per distance', dict(zip(pfs,[round(v,1) for v in mt])), 'use', best)
\"; exit \$rc" \
 "pfbest|170|export TIGHTFIT_CPU_PREFETCH=\$(cat /tmp/best_pf 2>/dev/null || echo 0); echo prefetch \$TIGHTFIT_CPU_PREFETCH; [ \"\$TIGHTFIT_CPU_PREFETCH\" = 0 ] && exit 0; python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0 --out \$D > \$D/full.txt 2>&1; rc=\$?; grep -E 'kernel-only|tok_s|^ +8GiB' \$D/full.txt | cut -c1-300 | head; exit \$rc"
