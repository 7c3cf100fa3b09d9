#!/bin/bash
# Session 5, device call 2 (record; the gemv_tma kernel was removed after this measurement and
# bench/gemv_tma_ab.py became bench/gemv_alone.py): the bulk-copy-staged GEMV (gemv_tma) — correctness, then A/B vs auto.
exec bash bench/suite.sh 420 \
 "tmaab|260|python3 bench/gemv_tma_ab.py --out \$D --formats Q4_K,Q5_K,Q6_K,IQ4_XS,Q8_0 --shapes ffn,kv --ns 1,8 --configs 3x1536,4x1024" \
 "tmatest|140|python3 -m pytest -q -x tests/test_gemv_tma.py -k 'Q4_K or Q6_K' 2>&1 | tail -15"
