#!/bin/bash
# Session 6, device call 5: FP16 split-K attention with programs sharing T evenly (issue 7 at 32K),
# decode with the sweep's pick, and the GEMV table of every format in one run (issue 6).
F=Q8_0,Q4_0,Q5_0,IQ4_NL,IQ4_XS,Q4_K,Q5_K,Q6_K,Q2_K,Q3_K,IQ2_XXS,IQ2_XS,IQ2_S,IQ3_XXS,IQ3_S,TQ1_0,TQ2_0,Q1_0,Q2_0
exec bash bench/suite.sh 590 \
 "asweep|80|python3 bench/attn_f16_sweep.py --ctx 8192,32768,131072 --out \$D" \
 "e2e|170|export TIGHTFIT_ATTN_F16_CFG=\$(cat \$OUT/res/asweep/best_cfg.txt 2>/dev/null); echo cfg=\$TIGHTFIT_ATTN_F16_CFG; TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 64 --depths 0,8192,32768 --out \$D" \
 "gemv|290|python3 bench/gemv.py --impls cu --formats $F --check-shapes kv --check-ns 1,8 --shapes ffn,kv --ns 1,8 --budget 240 --out \$D"
