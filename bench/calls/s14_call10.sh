#!/bin/bash
# Session 14, device call 10. Carry [".whl", ".tcache_in", ".fixtures"].
# Ran on 0e8f1eb (the min_per geometry option; removed in the next commit, no gain).
# Issue 10: the tensor-core GEMV's stream-K grid gives every resident warp a range, so a small
# matrix (5120->1024: 1,280 items for 2,112 warps) is cut into ~20 pieces per tile group, and the
# last arriving warp sums them one L2 round trip each. min_per (TIGHTFIT_MMA_MIN_PER, config
# "min_per") shrinks the grid so every warp has at least that many items. Per shape at N = 5 with
# min_per 1 (default), 3, 6, 12; the dp4a kernel at N = 1 for reference.
G="python3 bench/gemv.py --formats Q5_K,Q6_K,IQ4_XS --check-shapes '' --shapes kv,attn,other,ffn --budget 100 --out \$D"
P="python3 -c \"import json;[print(d['impl'],d['type'],d['n_in'],d['n_out'],d['N'],d['cfg'],round(d['us'],1)) for d in map(json.loads,open('\$D/gemv.jsonl')) if d.get('kind')=='time']\""
exec bash bench/suite.sh 200 \
 "mp|130|$G --impls mma --ns 5 --configs '[{\"min_per\":1},{\"min_per\":3},{\"min_per\":6},{\"min_per\":12}]' > \$D/full.txt 2>&1; $P" \
 "cu|50|$G --impls cu --ns 1 > \$D/full.txt 2>&1; $P"
