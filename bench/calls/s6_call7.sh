#!/bin/bash
# Session 6, device call 7 (the last ~4 device minutes): quantized-KV decode with the split-K CTA
# count capped at 64 per KV head, on a state made for 131,584 positions (call 6: 257 CTAs per head).
exec bash bench/suite.sh 150 \
 "e2e|125|TIGHTFIT_DEVICE_EMBED=1 python3 bench/e2e.py --tokens 32 --depths 8192,32768 --ctx 131584 --kv-types q8_0,tq3 --out \$D"
