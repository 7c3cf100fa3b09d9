#!/bin/bash
# Session 23, device call 2. Carry [".whl", ".tcache_in"].
# The verify block's five-column products that cost 2-2.5x their one-column time (call 1's launch-order
# profile): the GDN gates (Q8_0 5120->48, and 96 rows as one launch of both), attn_k (Q6_K 5120->1024),
# attn_v (Q5_K 5120->1024), and Q6_K's ffn_down / output head on the tensor-core kernels, per config;
# the GDN block kernel with the next token's loads issued before the current token's update, alone and
# in the M = 5 verify graph.
export TIGHTFIT_DEVICE_EMBED=1
G='python3 bench/gemv.py --check-shapes "" --budget 60 --out $D'
CU='[{}, {"kern": "v3"}, {"kern": "v4", "wpr": 8}, {"kern": "v4", "wpr": 4}, {"kern": "v4", "wpr": 2}, {"kern": "v4", "wpr": 1}]'
MM='[{"rt": 1, "pipe": 0}, {"rt": 2, "pipe": 0}, {"rt": 1, "pipe": 1}, {"rt": 2, "pipe": 1}, {"rt": 2, "pipe": 1, "nst": 3}, {"rt": 1, "pipe": 0, "ctas_per_sm": 1}]'
V='python3 bench/verify_profile.py --ms 5 --out $D > $D/v.txt 2>&1; rc=$?; grep -E "step:|graph|^ *[15] " $D/v.txt | head -8; exit $rc'
exec bash bench/suite.sh 560 \
  "gdn|60|python3 bench/gdn_block.py --ms 1,5 --configs 8,1:16,2 --out \$D | tail -12" \
  "ms5|170|$V" \
  "q8gate|80|$G --formats Q8_0 --impls cu --shapes gate --ns 1,5 --configs '$CU' | tail -40" \
  "small|90|$G --formats Q6_K,Q5_K --impls cu --shapes kv --ns 1,5 --configs '$CU' | tail -40" \
  "smallmma|80|$G --formats Q6_K,Q5_K --impls mma --shapes kv --ns 5 --configs '$MM' | tail -30" \
  "q6big|90|$G --formats Q6_K --impls mma --shapes down,head --ns 5 --configs '$MM' | tail -30"
