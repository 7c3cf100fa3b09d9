#!/bin/bash
# Session 14, device call 11. Carry [".whl", ".tcache_in", ".fixtures"].
# Ran on the tree of 0e8f1eb before its commit (cu and mma per shape; no code of its own).
# Issue 10: call 10 showed the tensor-core GEMV with a ~10 us fixed cost on small matrices (Q5_K
# 5120->1024 at N = 5: 12.9 us; dp4a at N = 1: 3.7). The route sends every N >= MMA_MIN_N product of
# a format there whatever its shape. Both kernels per shape at N = 2, 3, 5, 8 (same machine), for a
# shape-aware crossover.
G="python3 bench/gemv.py --formats Q5_K,Q6_K,IQ4_XS,Q4_K --check-shapes '' --shapes kv,attn,other,ffn --ns 2,3,5,8 --budget 120 --out \$D"
P="python3 -c \"import json;[print(d['impl'],d['type'],d['n_in'],d['n_out'],d['N'],round(d['us'],1)) for d in map(json.loads,open('\$D/gemv.jsonl')) if d.get('kind')=='time']\""
exec bash bench/suite.sh 200 \
 "x|160|$G --impls cu,mma > \$D/full.txt 2>&1; $P"
