#!/bin/bash
# Session 17, device call 8. Carry [".whl", ".tcache_in", ".fixtures"].
# gemv_mmh's stalls (call 6): 34 % on the first use of a block's weight words, ~10 % on x. Variants:
# weights loaded without L1 allocation (TF_MMH_WNA, so x keeps L1), an L2 prefetch of the rows'
# next block or the one after (TF_MMH_PF), and both.
exec bash bench/suite.sh 300 \
 "mmh|240|python3 bench/mmh.py --out \$D --shapes 5120x17408,17408x5120,5120x12288,5120x10240 --ns 1,5 --check-ns 5"
