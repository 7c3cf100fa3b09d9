#!/bin/bash
# Session 6, device call 4: FP16 attention launch sweep (issue 7 at 32K), decode per KV type with
# PDL + merged launches on by default (issues 7, 11), the 8 GiB host path with the new defaults
# (issue 5), speculative decoding with the tensor-core GEMV for the verify widths (issue 10).
exec bash bench/suite.sh 590 \
 "asweep|110|python3 bench/attn_f16_sweep.py --ctx 32768 --out \$D" \
 "e2e_kv|250|export TIGHTFIT_ATTN_F16_CFG=\$(cat \$OUT/res/asweep/best_cfg.txt 2>/dev/null); echo cfg=\$TIGHTFIT_ATTN_F16_CFG; TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 64 --depths 0,8192,32768 --kv-types f16,q8_0,tq3 --out \$D" \
 "plan8g|100|python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0 --out \$D" \
 "spec_mma|120|TIGHTFIT_GEMV_MMA=1 TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec.py --seedmix --skip-real --forced-modes fixed --budget-s 100 --out \$D"
