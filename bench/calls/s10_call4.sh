#!/bin/bash
# Session 10, device call 4 (carry [".whl", ".tcache_in", ".fixtures"]).
#  - issue 10: bench/spec.py with one reused state (as a Session keeps it: the verify graphs are
#    captured in the warm-up, not in the timed runs), 512 tokens; forced 0 / 0.8 at k = 4, then the
#    real drafters (ngram, suffix, mtp) on the copy task and prose, each request twice (the second
#    is an agent replay: the suffix cache holds the first one's output);
#  - issue 5: the 8 GiB placed decode with the L2 prefetch (8192 bytes) and without, one host.
export TIGHTFIT_CHAT_TEMPLATE=$PWD/.fixtures/Qwen3.5-4B.jinja
export TIGHTFIT_VOCAB_FIXTURE=$PWD/.fixtures/ggml-vocab-qwen35.gguf
exec bash bench/suite.sh 570 \
 "spec|230|TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec.py --seedmix --forced-modes fixed,adaptive --max-tokens 512 --real-prompts repeat,prose --budget-s 200 --out \$D > \$D/full.txt 2>&1; rc=\$?; tail -16 \$D/full.txt; exit \$rc" \
 "pf|270|for p in 8192 0; do TIGHTFIT_CPU_PREFETCH_L2=\$p python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0 --out \$D/p\$p > \$D/p\$p.txt 2>&1; echo \"L2 prefetch \$p: \$(grep -E 'kernel-only' \$D/p\$p.txt | head -1)\"; grep -E '^ +8GiB' \$D/p\$p.txt | head -1; grep -E '^group:' \$D/p\$p.txt | head -4; done"
