#!/bin/bash
# Next session, device call 3: speculative decoding (issue 10) and the 8 GiB host path (issue 5).
exec bash bench/suite.sh 590 \
 "spec|330|TIGHTFIT_DEVICE_EMBED=1 python3 bench/spec.py --seedmix --skip-real --budget-s 300 --out \$D" \
 "plan8g|230|python3 bench/plan_vram.py --budgets 8GiB --tokens 6 --profile-tokens 6 --profile-threads 0 --out \$D"
