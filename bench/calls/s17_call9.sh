#!/bin/bash
# Session 17, device call 9. Carry [".whl", ".tcache_in", ".fixtures"].
# gemv_mmh through a 2-stage cp.async ring of one-block items at two CTAs per SM (pipe 1): call 3
# put L1 at 66-80 % busy, the 4-byte weight loads touching 8 rows per instruction.
exec bash bench/suite.sh 300 \
 "mmh|240|python3 bench/mmh.py --out \$D --shapes 5120x17408,17408x5120,5120x12288,5120x10240 --ns 1,5 --check-ns 5"
